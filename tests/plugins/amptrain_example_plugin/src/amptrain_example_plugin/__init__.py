"""Example amptrain plugin (see trainer_core/components/README.md)."""
