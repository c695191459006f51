"""Where tierswap.torch's parameters live, behind one small interface.

``HostParams``: CPU parameters. Each trainable parameter's storage becomes tierswap's 16-bit
copy (zero-copy: the step writes the new values there), and gradients are lent to the step or
copied in from host memory.

``DeviceParams``: parameters in device memory, CUDA ones (``cuda:N``), or CPU tensors standing
in for device memory on the simulated device tier (``device_tier="simulated"``: the same
hand-over without a GPU, which is how the tests run it). Each parameter keeps its own storage;
tierswap binds it as the device copy of its 16-bit values and writes every step's new values
there (``bind_param16_device``). Gradients go over with ``add_grad_device``: on CUDA, ordered
after an event recorded on torch's current stream once the producer queued them (the native
side waits on that event on its own stream, never a device-wide sync, and is done reading the
gradient when the call returns, so the caller may free it); on the simulated tier, straight from
the host memory standing in.
"""

import torch

# The native side's names of the dtypes it takes (tierswap.torch uses this table too).
DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def dtype_name(dtype):
    return DTYPE_NAMES[dtype]


class HostParams:
    kind = "host"
    grads_on_cpu = True
    lends = True  # the step may read gradients in place (lend_grads)
    aliases = True  # a parameter's storage is tierswap's: given its own again at close

    def tier_keys(self):
        return {"device_mode": "off"}

    def check(self, p, where):
        if p.device.type != "cpu":
            raise ValueError(f"{where} is on {p.device}, the optimizer's other parameters on the "
                             "CPU: one device per optimizer")

    def attach(self, native, p, nid):
        """p's storage becomes tierswap's 16-bit copy; returns the storage's address."""
        p.data = torch.frombuffer(native.param16_view(nid), dtype=p.dtype).view(p.shape)
        return p.data_ptr()

    def host_values(self, p):
        """p's values in host memory (for the initial masters, and to compare with them)."""
        return p.detach()

    def add_grad(self, native, nid, g):
        native.add_grad(nid, g.data_ptr(), dtype_name(g.dtype), g.numel())

    def describe(self, p):
        return "CPU"


class DeviceParams:
    lends = False
    aliases = False

    def __init__(self, device, simulated):
        self.device = device
        self.simulated = simulated
        self.kind = "simulated device" if simulated else str(device)
        self.grads_on_cpu = simulated

    def tier_keys(self):
        # The simulated tier stands in for the GPU's memory; a real GPU needs no device tier
        # for this (state on the host and NVMe tiers, stepped by the CPU: ZeRO-Offload).
        # The simulated tier's budget bounds host memory standing in for the GPU's; without a
        # plan nothing is placed there.
        if self.simulated:
            return {"device_mode": "simulated", "device_budget": "64MiB"}
        return {"device_mode": "off"}

    def check(self, p, where):
        if p.device != self.device:
            raise ValueError(f"{where} is on {p.device}, the optimizer's first parameter on "
                             f"{self.device}: one device per optimizer")

    def attach(self, native, p, nid):
        """Binds p's own storage as the device copy of its 16-bit values (filled now, written at
        every step); returns its address."""
        native.bind_param16_device(nid, p.data_ptr())
        return p.data_ptr()

    def host_values(self, p):
        return p.detach() if self.simulated else p.detach().cpu()

    def add_grad(self, native, nid, g):
        events = []
        if not self.simulated:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(g.device))  # after whatever produced g
            events = [ev.cuda_event]
        native.add_grad_device(nid, g.data_ptr(), dtype_name(g.dtype), g.numel(), events)

    def describe(self, p):
        return f"{self.kind}"


def for_params(params, device_tier):
    """The interface for `params` (all of the optimizer's, the first one decides), with
    `device_tier` None (follow the parameters) or "simulated" (CPU parameters through the
    device path, host memory standing in for the GPU's)."""
    first = next(iter(params), None)
    if device_tier is None:
        if first is None or first.device.type == "cpu":
            return HostParams()
        if first.device.type != "cuda":
            raise ValueError(f"parameters on {first.device}: tierswap.torch takes CPU or CUDA "
                             "parameters")
        if not torch.cuda.is_available():
            raise ValueError(f"parameters on {first.device} but torch sees no usable GPU")
        return DeviceParams(first.device, simulated=False)
    if device_tier != "simulated":
        raise ValueError(f"device_tier={device_tier!r}: None (follow the parameters) or "
                         "'simulated' (CPU parameters handled as device ones, for tests)")
    if first is not None and first.device.type != "cpu":
        raise ValueError(f"device_tier='simulated' stands CPU tensors in for device memory; the "
                         f"parameters are on {first.device}")
    return DeviceParams(torch.device("cpu"), simulated=True)
