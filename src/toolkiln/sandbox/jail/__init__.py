"""Code that runs inside the sandbox's template process and its children.

Standard library only: the template is started as ``python -I -S -B template.py`` with an
empty environment, so nothing of the service (its packages, settings or secrets) is loaded.
"""
