"""Built-in models, datasets, optimizers and schedules (torch).

Components are declared (name, builder, arguments, description) in the
torch-free ``trainer_core.contract.catalog`` and built through ``trainer_core.registry``.
How to add your own through a plugin: see ``README.md`` in this folder.
"""
