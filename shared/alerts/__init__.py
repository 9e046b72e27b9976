"""Alerts as pure decisions: the rules that raise and resolve them, and the book that folds, rate-limits and
resolves them. No I/O.
"""
