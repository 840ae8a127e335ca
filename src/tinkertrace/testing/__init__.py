"""tinkertrace.testing"""
