"""What several methods share: the training loop, alignment losses, detection evaluation, dictionary learning."""
