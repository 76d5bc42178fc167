"""The ranks of a torch.distributed group as a ring, and the one exchange ring attention makes:
send a buffer to the next rank while receiving its counterpart from the previous one."""

import torch.distributed as dist

from .._args import InvalidArgumentError

# P2P tags (gloo matches messages by tag; NCCL ignores them): K/V blocks and the dk/dv
# accumulators of the backward are both in flight between the same ranks at once.
TAG_KV = 0
TAG_GRAD = 1


class Ring:
    """rank and size of this process in `group`, and the global ranks of its neighbours. Without an initialized
    default group and with group=None: a ring of one (a single process, no communication)."""

    def __init__(self, group):
        if group is None and not (dist.is_available() and dist.is_initialized()):
            self.group, self.rank, self.size = None, 0, 1
            return
        self.group = dist.group.WORLD if group is None else group
        self.rank = dist.get_rank(self.group)
        if self.rank < 0:
            raise InvalidArgumentError("group: this process is not a member of it")
        self.size = dist.get_world_size(self.group)
        self.next = dist.get_global_rank(self.group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(self.group, (self.rank - 1) % self.size)

    def exchange(self, send, recv, tag):
        """Starts sending `send` to the next rank and receiving the previous rank's into `recv` (both contiguous);
        returns the requests, for wait(). Nothing may write `send` or touch `recv` until they are done."""
        return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, self.next, self.group, tag),
                                       dist.P2POp(dist.irecv, recv, self.prev, self.group, tag)])


def wait(requests):
    """Waits for an exchange (on the GPU: the current stream waits for it; the host does not)."""
    for request in requests or ():
        request.wait()
