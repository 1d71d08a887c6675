"""A toy shop: stock keeping and price computation."""
