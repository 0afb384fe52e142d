"""The daemon's life cycle: claims and checks at start-up, the tiers opened onto them, the process and its
loop, the stop budget, service-manager notification, the heap. Owns what it builds; may import every room."""
