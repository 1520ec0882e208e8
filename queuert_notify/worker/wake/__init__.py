"""How a worker learns that there is work: the claim decision and its sleep (policy),
the notify subscriptions it holds for its lifetime (subscriptions), and the bounds on
every call it makes to a notify adapter (bounds). Imports the notify protocol and the
worker's settings, never the worker loop itself."""
