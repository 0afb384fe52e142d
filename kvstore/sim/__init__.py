"""Capacity planning: replay request traces through the daemon's own Store over payload-less tiers."""
