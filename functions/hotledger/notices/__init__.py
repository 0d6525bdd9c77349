"""Payment orders with close reminders, the app inbox and unfinished-business journeys."""
