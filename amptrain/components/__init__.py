"""Built-in models, datasets, optimizers and schedules (torch).

Components are declared (name, builder, arguments, description) in the
torch-free ``amptrain.contract.catalog`` and built through ``amptrain.components.registry``.
How to add your own through a plugin: see ``README.md`` in this folder.
"""
