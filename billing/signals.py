"""What billing tells the rest of the house; alerts (e-mail, webhooks) hook here."""

from django.dispatch import Signal

# Sent once per workspace, month and threshold, with `alert` (a SpendAlert) when its spend reaches
# that share of the tier's monthly cap.
spend_threshold_reached = Signal()
