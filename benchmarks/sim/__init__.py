"""The virtual-time simulator: aserve's real batcher and policies on a loop whose clock jumps.

`virtualtime.VirtualLoop` is the loop; `simulation` drives real `Batcher`s on it with a
simulated engine. The batching benchmark (`--simulate`) and the policies' tests use it.
"""
