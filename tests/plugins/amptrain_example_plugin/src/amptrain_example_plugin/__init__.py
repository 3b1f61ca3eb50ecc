"""Example amptrain plugin (see amptrain/components/README.md)."""
