"""The Jinja templates fleet renders for every node (shipped as the package fleet.templates)."""
