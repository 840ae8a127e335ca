"""tinkertrace.training"""
