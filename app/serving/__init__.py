"""The models a server offers: their specs and settings, loading one, the registry of resident ones."""
