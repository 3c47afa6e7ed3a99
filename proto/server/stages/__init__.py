"""API pipeline stages: the safety scan, the item cache, stored chains. Each gets the store it uses, not
the ``Pipeline``."""
