"""tinkertrace.builder"""
