"""Private: the data plane. Record batches, the accumulator, the partitioner and the sender, over an injectable
produce transport."""
