"""Flower app wiring: ServerApp, ClientApp and the validated run config."""
