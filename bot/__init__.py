"""Discord side of the fleet: a notifier that relays the event stream into a channel."""
