"""The project's own package, imported by train.py from the working directory."""
