"""tinkertrace.sdk"""
