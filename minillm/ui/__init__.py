"""What the terminal shows: number formatting, tables and verdicts (`report`)."""
