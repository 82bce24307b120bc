"""The ground floor: errors, settings, secrets and crash points; imports nothing of trainfleet's."""
