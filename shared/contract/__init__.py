"""The bus contract: subjects, payload models and events, and who may do what on the bus. No I/O.
"""
