"""What a task and a batch are, the rules they follow and the errors they raise: no I/O."""
