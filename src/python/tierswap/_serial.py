"""How calls reach a tierswap.torch optimizer's native side: one at a time, and a reader of the
state only while no speculative result of the overlapped step is pending."""

import functools
import threading
import time


def one_at_a_time(method):
    """One call into the native optimizer at a time (a checkpoint thread's state_dict() while
    the training thread steps): a second caller waits, without the GIL, for the first. It is
    re-entrant (state_dict() gathers through _param_state()); step() runs its closure outside
    it, so that hooks handing gradients over take it from whichever thread runs them."""
    @functools.wraps(method)
    def serialized(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    return serialized


def settled(what):
    """A reader of the state (state_dict, opt.state[p], save): while the overlapped step's
    speculative results wait for step(), the state is not the committed one. A call from another
    thread (a checkpoint thread) waits for the trainer's step() to settle them; the trainer's own
    thread, between its backward and step(), is told to read after step()."""
    def decorate(method):
        @functools.wraps(method)
        def settled(self, *args, **kwargs):
            while True:
                with self._lock:
                    if not self._native.speculation_pending():
                        return method(self, *args, **kwargs)
                    if self._trainer == threading.get_ident():
                        raise RuntimeError(
                            f"{what}: the overlapped step (on by default from the second "
                            "step) has begun stepping this backward's gradients, so the state "
                            "is between steps: read it after step() (or before the backward), "
                            "or build the optimizer with overlap=False")
                time.sleep(0.001)  # the lock released: the trainer's step() settles them
        return settled
    return decorate
