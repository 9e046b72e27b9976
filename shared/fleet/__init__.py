"""The fleet's inventory sources as pure translations: topology files, telemetry and its health verdict,
the device plugin's and GPU feature discovery's labels, inventory documents. No I/O.
"""
