"""What several methods share: the training loop, aggregation, the evaluation summary, alignment pieces, detection
training and evaluation, dictionary learning, batched local training."""
