"""API pipeline stages: the safety scan, the item cache, stored chains."""
