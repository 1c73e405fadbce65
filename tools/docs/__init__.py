"""Sections of the docs generated from the code (each with a test that the page holds what the code generates)."""
