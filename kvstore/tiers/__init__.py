"""Storage tiers: the allocator, the host shared-memory arena and (where present) disk, GPU and remote tiers."""
