"""Clients of outside model endpoints; they implement ``services.ports.ChatModel``."""
