"""Shipped tables of tuned launch parameters, one JSON file per GPU."""
