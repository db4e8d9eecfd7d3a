"""deepinit's local sweep launcher (a Hydra plugin: Hydra finds it in the hydra_plugins
namespace package, which therefore has no __init__.py of its own)."""
