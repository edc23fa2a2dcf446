"""Example models and profiles for pytest-modelprof."""
