"""tinkertrace.engine"""
