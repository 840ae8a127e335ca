"""tinkertrace.serving"""
