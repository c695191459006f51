"""torch.optim optimizers whose state lives on tierswap's tiers (pinned host memory and NVMe).

The model may be on the GPU (``cuda:N``, bf16 or fp16) or on the CPU. On the GPU each step's
gradients go to the host tier from the GPU, ordered after torch's current stream, and the new
16-bit values are written back into each ``p`` on the GPU; the state stays on the host and NVMe
tiers (ZeRO-Offload / ZeRO-Infinity). On the CPU:

``tierswap.torch.AdamW`` (and ``Adam``, ``SGD``, ``Lion``) subclass :class:`torch.optim.Optimizer`:
torch's constructor arguments and defaults, plus the tier keywords below. The model keeps its
parameters in bfloat16 or float16; tierswap keeps the fp32 master weights and the moments on the
tiers, takes each ``p.grad`` (bf16, fp16 or fp32; a parameter whose ``p.grad`` is ``None`` is
left alone, as torch.optim leaves it), steps with its fused kernels, and the new 16-bit values
appear in ``p``: each trainable parameter's storage is tierswap's own 16-bit copy, which the fused
kernel writes (zero-copy; close() gives the parameters their own storage back). Weights written
into ``p`` after construction (``model.load_state_dict``, ``torch.nn.init``, ``p.copy_``) become
the fp32 masters at the next backward or step (a one-time warning says so); a write through
``p.data`` escapes torch's version counter and is not seen. What differs from torch.optim is
listed in the table of tools/docs/pytorch.md::

    model = model.to(torch.bfloat16)
    opt = tierswap.torch.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1,
                               swap_dir="/nvme/ts", host_budget="8GiB", max_grad_norm=1.0)
    for batch in data:
        loss = model(batch).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

Tier keywords (all optional; the defaults work untuned):
  swap_dir        a directory or a list (one per drive: striped); default TIERSWAP_SWAP_DIRS, else
                  a private temporary directory under $TMPDIR or /var/tmp, removed at close()
                  (one a killed process left: by the next optimizer on the host)
  host_budget     pinned host bytes, "8GiB" or an int (default 1 GiB, or TIERSWAP_HOST_BUDGET;
                  through a node service, at most what it offers this rank: its share of the
                  node's budget, 1/LOCAL_WORLD_SIZE, and so for the pageable memory where the
                  gradients wait: those that do not fit spill to NVMe)
  state_tier      "auto" (host memory when everything fits in half the budget), "host", "nvme"
  subgroup_size   elements per sub-group, a count as the CLI's --sub-group ("4M" = 4,000,000,
                  rounded up to a multiple of 8192; default: from the budget, at most 8Mi)
  overlap         sub-groups step during the backward (with hooks): the bit-exact overlapped step.
                  Default: on wherever the default hooks are (GPU parameters, one process); a
                  backward is taken as the last before step() as micro_batch(final=...) says,
                  else as the count of backward passes of the step before says (a wrong guess is
                  redone at step(), exactly)
  plan            a placement plan file (``tierswap plan --out``)
  max_grad_norm   clip the global gradient norm inside the step (0: off); or keep it 0 and call
                  opt.clip_grad_norm_(params, max_norm) where a torch recipe clips (torch's
                  norm: the recipe reproduced bit for bit)
  loss_scale      None (bf16), "dynamic" (fp16, GradScaler's rules) or a number (fixed)
  init_scale, growth_factor, backoff_factor, growth_interval   the dynamic scaler's settings
  bf16_moments    moments stored in bf16 (fewer bytes; changes results)
  accumulate_fp32 gradient accumulation in fp32 (else in the parameters' 16-bit dtype)
  telemetry       serve `tierswap ps` / `tierswap residency PID` (default on)
  hooks           hand each gradient over as soon as the backward accumulated it (frees p.grad:
                  torch.nn.utils.clip_grad_norm_ then refuses these parameters; clip with
                  max_grad_norm). Default (None): CPU parameters hand over at step() (read in
                  place, the cores left to the backward); GPU parameters at step() in the first
                  step, then by hooks with the overlapped step, unless that step clipped through
                  p.grad (opt.clip_grad_norm_ or torch's) or the world has several ranks. A
                  p.grad set by hand (not by a backward) is still taken at step()
  threads         CPU kernel threads (default: all)
  communicator    "auto" (torch.distributed's world when initialized with > 1 rank, else MPI
                  under mpirun, else one process), "torch", "single", "mpi", or a
                  tierswap.distributed.TorchCommunicator(group)
  keep_swap_files keep the swap files at close() (default: removed at a clean end; a run that
                  ends by an exception or Ctrl-C after a step keeps them, as a crash does)
  resume          continue from the swap_dir of a run that crashed (or kept its files): state,
                  step count and loss scaler come back from its last committed step, the
                  parameters get its values; ``resumed`` says whether there was one,
                  ``step_count`` which batch is next. param_groups stay as given (step a
                  scheduler step_count times). Needs swap_dir, the same parameters, world size
  durable         fdatasync the swap files and fsync the manifest at every commit (default);
                  False: faster commits, still consistent after kill -9 but not after power loss
  service         the node service's socket (``tierswap serve``; default TIERSWAP_SERVICE): the
                  state lives in a region of the service's swap space, through memory shared
                  with it, under the node's one budget; swap_dir then keeps only the manifest
                  (and the previous one, recycled as the next commit's file)
  service_job     the job id the service knows this run by (default TIERSWAP_SERVICE_JOB, else
                  derived from swap_dir): with the rank, what a resumed run reattaches to
  device_tier     None: follow the parameters (CPU or CUDA); "simulated": CPU parameters handed
                  over as GPU ones, host memory standing in for the GPU's (the GPU path's logic
                  exercised without a GPU: tests)
  pipelined_commit  step t's commit (its writes, sync and manifest) runs while the trainer computes
                  step t+1's forward (default on): opt.step() returns once the state is stepped;
                  the next call that touches the state waits for it, and if it failed, rolls
                  step t back (state, parameters, loss scaler) and raises naming it. A crash
                  resumes from step t-1 (``step_count`` says which batch is next). Taken with one
                  rank and persisted state; else (and with False) inside step()
  persist_resident_state  host-resident state is also committed to NVMe every step (default:
                  crash-consistent, exact rollback); False keeps it in memory only (no NVMe I/O
                  for it, as torch.optim's state; save() is then its durability; with all of
                  it in memory, a step writes nothing to the swap directory)

Distributed: with torch.distributed initialized, every rank constructs the optimizer over the same
parameters; each owns 1/world of the state, hands over its local gradients (summed over ranks:
scale the loss by 1/world for a mean) and gets the whole model's new values after each step.
state_dict(), save() and load() are collective (every rank calls them); ``opt.state[p]``
(one parameter's state read from the tiers, as torch keys it) is for one process.

Errors: bad input raises TypeError / ValueError naming the parameter or option; a native error is
a RuntimeError (or ValueError) with its message.
"""

import contextlib
import json
import math
import os
import sys
import threading
import time
import warnings
import weakref

import torch
from torch.optim import Optimizer

from . import _checkpoint, _device, _serial, _tierswap, parse_count, parse_size
from . import _checks as check
from ._checkpoint import Checkpointing, StateView
from ._clip_guard import guard_torch_clipping
from ._serial import one_at_a_time
from ._swapdir import TempSwapDir
from .distributed import default_communicator

__all__ = ["AdamW", "Adam", "SGD", "Lion", "from_deepspeed_config"]

_DTYPE_NAMES = _device.DTYPE_NAMES
_TORCH_VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_FILES = {__file__, _checkpoint.__file__, _serial.__file__}


def _close_native(native, tmpdir, params, owner):
    if os.getpid() != owner:  # a forked child's copy (os.fork() without exec): its files,
        return                # threads and temporary directory are the parent's to close
    for p in params:  # the parameters alias tierswap's memory: give them their own again
        p.data = p.data.clone()
    # A run ending by an error keeps the swap files of its committed steps, as a crash does
    # (resume=True continues): an exception being handled, or one that ended the program
    # (sys.last_value: at exit, after an uncaught exception or Ctrl-C). A temporary directory
    # goes regardless (nothing could resume from it).
    failed = tmpdir is None and (sys.exc_info()[0] is not None
                                 or getattr(sys, "last_value", None) is not None)
    native.close(failed)
    if tmpdir is not None:
        tmpdir.remove()


def _tier_config(telemetry, durable):
    """The tier manager's keys the constructor sets."""
    return {"telemetry": bool(telemetry), "device_mode": "off", "durable": bool(durable)}


def _service_config(service, service_job):
    """The node service's keys given as keywords; the native side applies them over its
    variables (TIERSWAP_SERVICE, _JOB, _TIMEOUT, _WAIT)."""
    cfg = {}
    if service is not None:
        cfg["service"] = os.fspath(service)
    if service_job is not None:
        cfg["service_job"] = str(service_job)
    return cfg


class _TieredOptimizer(Checkpointing, Optimizer):
    """The common part (its state's readers and writers in Checkpointing); subclasses set _kind,
    _state_keys and _hyper()."""

    _kind = None
    _state_keys = ()  # (torch's key, tierswap's class) of every state the kind may keep

    def __init__(self, params, defaults, *, swap_dir=None, host_budget=None, state_tier="auto",
                 subgroup_size=None, overlap=None, plan=None, max_grad_norm=0.0,
                 loss_scale=None, init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, bf16_moments=False, accumulate_fp32=False, telemetry=True,
                 hooks=None, threads=None, communicator="auto", keep_swap_files=False,
                 swap_capacity=None, persist_resident_state=True, durable=True, resume=False,
                 service=None, service_job=None, device_tier=None, pipelined_commit=True):
        self._native = None
        self._lock = threading.RLock()  # see one_at_a_time
        self._tmpdir = None
        self._comm = default_communicator(communicator)  # kept alive beside the native side
        try:
            if overlap and hooks is False:
                raise ValueError("overlap=True steps sub-groups during the backward: it needs "
                                 "the hooks (hooks=True or the default)")
            if overlap and hooks is None:
                hooks = True  # asked for by name: on from the first step
            super().__init__(params, defaults)
            self._dev = _device.for_params((p for g in self.param_groups for p in g["params"]),
                                           device_tier)
            if hooks is None and not _hooks_by_default(self._dev):
                hooks = False
            auto = hooks is None and overlap is not False and _shadow_slots()
            self._check_params()
            opt_cfg = {
                "state_tier": check.choice("state_tier", state_tier, ("auto", "host", "nvme")),
                # the default's undo copies are laid out now, the mode is switched on later
                "overlap": bool(overlap) or auto,
                "max_grad_norm": check.nonneg("max_grad_norm", max_grad_norm),
                "bf16_moments": bool(bf16_moments),
                "accumulate_fp32": bool(accumulate_fp32),
                "persist_resident_state": bool(persist_resident_state),
                "pipelined_commit": bool(pipelined_commit),
                "loss_scaler": check.scaler(loss_scale, init_scale, growth_factor,
                                            backoff_factor, growth_interval),
            }
            if plan is not None:
                opt_cfg["plan"] = os.fspath(plan)
            for flag, why in ((resume, "resume=True continues from a swap directory"),
                              (keep_swap_files,
                               "keep_swap_files=True keeps the files for a later run")):
                if flag and _temporary(swap_dir):
                    raise ValueError(f"{why}: give swap_dir (a temporary one is removed at close)")
            budget = check.positive(host_budget, "host_budget", parse_size)
            capacity = check.positive(swap_capacity, "swap_capacity", parse_size)
            subgroup = check.positive(subgroup_size, "subgroup_size", parse_count)
            threads = check.threads(threads)
            tier_cfg = _tier_config(telemetry, durable)
            service_cfg = _service_config(service, service_job)
            tier_cfg.update(self._dev.tier_keys())
            dirs, self._tmpdir = _swap_dirs(swap_dir)
            problem = None
        except BaseException as e:
            problem = e
        try:
            _agree_before_native(self._comm, problem)
            self._native = _tierswap.Optimizer(
                swap_dirs=dirs, host_budget=budget,
                communicator="single" if self._comm is not None else str(communicator),
                comm=self._comm, threads=threads, optimizer_json=json.dumps(opt_cfg),
                tiers_json=json.dumps(tier_cfg), service_json=json.dumps(service_cfg),
                keep_swap_files=bool(keep_swap_files), swap_capacity=capacity,
                subgroup_size=subgroup, resume=bool(resume), temporary=self._tmpdir is not None)
            self._register()
        except BaseException:
            self._abandon()
            raise
        # given their own memory again at close (CPU parameters: their storage is tierswap's)
        self._aliased = [p for p, _ in self._ids] if self._dev.aliases else []
        self._closer = weakref.finalize(self, _close_native, self._native, self._tmpdir,
                                        self._aliased, os.getpid())
        self._hooks = bool(hooks)
        # hooks=None: "first step" (handed over at step(), watched), then "on" or "off"
        self._auto = "first step" if hooks is None else None
        self._overlap_auto = auto
        self._reads_grads = False  # the watched step clipped through p.grad
        self._backwards = 0  # backward passes of this step the hooks began (the default mode)
        self._per_step = 1  # ... and of the step before: the one that ends like it is the last
        self._max_grad_norm = opt_cfg["max_grad_norm"]
        self._scaled = opt_cfg["loss_scaler"]["mode"] != "none"
        self._clip_factor = None  # clip_grad_norm_'s, for the next step
        self._handles = []
        self._in_backward = False
        self._final = True
        self._handed = set()  # native ids given a gradient since the last step
        self._trainer = None  # the thread of the last backward
        self._said = set()  # the one-time warnings given
        self.last_step = None
        self.state = StateView(self)
        for p, _ in self._ids:
            p._tierswap_owner = weakref.ref(self)
        self._record_versions()
        if auto:
            self._native.set_overlap(False)  # until the first step is over
        if hooks is not False:
            self._install_hooks(self._ids)
            guard_torch_clipping(self)

    # ---- construction -----------------------------------------------------------------------
    def add_param_group(self, param_group):
        """torch's add_param_group. Between steps (progressive unfreezing) the new group's state
        is laid out beside the others', its master weights taken from its parameters, and
        committed; its step count starts at 0 as torch's does. The swap space is sized at
        construction: give swap_capacity room for groups added later (the error says how much).
        A resumed run (resume=True) passes every group, the added ones too, to the constructor.
        Collective at world size > 1."""
        if getattr(self, "_native", None) is None:  # torch's constructor adding its groups
            check.listed_params(param_group, len(self.param_groups))
            super().add_param_group(param_group)
            return
        self._add_group_between_steps(param_group)

    @one_at_a_time
    def _add_group_between_steps(self, param_group):
        gi, problem = len(self.param_groups), None
        try:
            if self._in_backward:
                raise RuntimeError("add_param_group: between steps only (a backward is under "
                                   "way: add it after step())")
            check.listed_params(param_group, gi)
            super().add_param_group(param_group)  # torch's checks and defaults
            self._check_group(gi, self.param_groups[gi])
            h = self._group_hyper(gi, self.param_groups[gi])
        except BaseException as e:  # every rank learns of it, below
            problem = e
        try:
            self._agree(problem, "add_param_group")
            group = self.param_groups[gi]
            values = [(pi, p, self._dev.host_values(p)) for pi, p in enumerate(group["params"])
                      if p.numel() > 0]
            given = [(f"group{gi}.param{pi}", list(p.shape), _DTYPE_NAMES[p.dtype],
                      bool(p.requires_grad), v.data_ptr()) for pi, p, v in values]
            nids = self._native.add_group_between_steps(self._kind, h, f"group{gi}", given)
        except BaseException:
            del self.param_groups[gi:]
            raise
        self._adopt_group(gi, group, h, iter(nids))

    def _adopt_group(self, gi, group, h, nids):
        """The Python side of a group the native side added: its parameters alias their 16-bit
        copies, and every lookup knows them."""
        new = []
        for pi, p in enumerate(group["params"]):
            if p.numel() == 0:
                continue
            nid = next(nids)
            if not p.requires_grad:
                self._frozen.append((f"param_groups[{gi}]['params'][{pi}]", p))
                continue
            self._storage.append(self._dev.attach(self._native, p, nid))
            p._tierswap_owner = weakref.ref(self)
            new.append((p, nid))
        self._ids.extend(new)
        if self._dev.aliases:
            self._aliased.extend(p for p, _ in new)
        self._versions.extend(p._version for p, _ in new)
        self._nid_of.update((id(p), nid) for p, nid in new)
        self._numel.update((nid, p.numel()) for p, nid in new)
        self._group_ids.append([id(p) for p in group["params"]])
        self._group_at.update((id(p), gi) for p in group["params"])
        self._hyper_sent.append(h)
        if self._hooks or self._auto:
            self._install_hooks(new)

    def _check_params(self):
        for gi, group in enumerate(self.param_groups):
            self._check_group(gi, group)

    def _check_group(self, gi, group):
        for pi, p in enumerate(group["params"]):
            where = f"param_groups[{gi}]['params'][{pi}] (shape {tuple(p.shape)})"
            if p.is_sparse:
                raise TypeError(f"{where} is sparse: tierswap takes dense parameters")
            if p.dtype not in (torch.bfloat16, torch.float16):
                raise TypeError(
                    f"{where} is {p.dtype}: tierswap keeps the fp32 master weights itself and "
                    "takes the model in bfloat16 or float16 (model.to(torch.bfloat16))")
            self._dev.check(p, where)
            if not p.is_contiguous():
                raise ValueError(f"{where} is not contiguous")
            check.not_owned(p, where)
            first = group["params"][0].dtype
            if p.dtype != first:
                raise ValueError(f"{where} is {p.dtype} and param_groups[{gi}]['params'][0] "
                                 f"{first}: one dtype per group (give the {p.dtype} "
                                 "parameters a group of their own)")

    def _where(self, p):
        """The parameter as the user wrote it: its place in param_groups, and its shape."""
        for gi, group in enumerate(self.param_groups):
            for pi, q in enumerate(group["params"]):
                if q is p:
                    return f"param_groups[{gi}]['params'][{pi}] (shape {tuple(p.shape)})"
        return f"a parameter of shape {tuple(p.shape)}"

    def _warn_once(self, key, message):
        if key not in self._said:
            self._said.add(key)
            warnings.warn(message, stacklevel=_user_level())

    def _abandon(self):
        """A constructor that failed: the native side closed now (what it would do when collected:
        a swap directory's committed state stays), a temporary swap directory removed."""
        if self._native is not None:
            self._native.close()
        if self._tmpdir is not None:
            self._tmpdir.remove()

    def _register(self):
        n = self._native
        problem = None
        try:
            self._add_groups(n)
        except BaseException as e:  # every rank learns of it, below
            problem = e
        self._agree(problem, "the optimizer's setup")  # finalize() is a collective
        self._nid_of = {id(p): nid for p, nid in self._ids}  # opt.state's lookups
        self._numel = {nid: p.numel() for p, nid in self._ids}
        self._group_at = {pid: gi for gi, ids in enumerate(self._group_ids) for pid in ids}
        n.finalize()
        self.resumed = n.resumed()
        if self.resumed:  # param_groups stay as the trainer made them (torch's way: a scheduler
            # stepped step_count times restores the lr), sent at the next step
            self._hyper_sent = [None] * len(self._hyper_sent)
        else:
            keep = [(self._dev.host_values(p), nid) for p, nid in self._ids]
            n.initialize([(nid, v.data_ptr(), _DTYPE_NAMES[v.dtype], v.numel()) for v, nid in keep])
            del keep
        # CPU parameters: each one's storage becomes tierswap's 16-bit copy, which the fused
        # kernel writes at every step (zero-copy). Device parameters keep theirs, bound as the
        # device copy the step writes.
        self._storage = [self._dev.attach(n, p, nid) for p, nid in self._ids]

    def _add_groups(self, n):
        self._ids = []  # (param, native id) of trainable parameters, in order
        self._frozen = []  # (where, param): no state kept, so never given a gradient later
        self._group_ids = []
        self._hyper_sent = []
        for gi, group in enumerate(self.param_groups):
            h = self._group_hyper(gi, group)
            n.add_group(self._kind, h, f"group{gi}")
            self._hyper_sent.append(h)
            self._group_ids.append([id(p) for p in group["params"]])
            for pi, p in enumerate(group["params"]):
                if p.numel() == 0:
                    continue  # nothing to step or hold (torch's step leaves it as it is too)
                nid = n.add_param(gi, f"group{gi}.param{pi}", list(p.shape),
                                  _DTYPE_NAMES[p.dtype], bool(p.requires_grad))
                if p.requires_grad:
                    self._ids.append((p, nid))
                else:
                    self._frozen.append((f"param_groups[{gi}]['params'][{pi}]", p))

    def _check_storage(self):
        """Each trainable parameter still on the storage the constructor gave it: the step writes
        the new values there, so a parameter moved off it would silently stop training."""
        if not self._closer.alive:
            return  # closed: the native call says so
        for (p, nid), ptr in zip(self._ids, self._storage):
            if p.data_ptr() != ptr:
                raise RuntimeError(
                    f"parameter {nid} (shape {tuple(p.shape)}, {p.dtype}, {p.device}) is no longer "
                    "on the storage this optimizer gave it (p.data = ..., model.to(...), "
                    "load_state_dict of the model with assign=True): the step writes the new "
                    "values there, so they would not reach it. Build the optimizer after moving "
                    "or loading the model; copy values in place (p.copy_(...)) and then "
                    "load_state_dict with 'master_params' to set the weights of a built one")

    def _check_frozen(self):
        """A parameter frozen when the optimizer was built has no state here: unfrozen later, its
        gradient would be dropped and the parameter silently left untrained."""
        for where, p in self._frozen:
            if p.grad is None:
                continue
            what = f"{where} (shape {tuple(p.shape)}) was frozen (requires_grad=False) when this " \
                   "optimizer was built, so tierswap keeps no state for it"
            if p.requires_grad:
                raise RuntimeError(f"{what}, and it has a gradient now: it would not be trained. "
                                   "Build the optimizer after unfreezing it")
            raise RuntimeError(f"{what}, but it still has a gradient (from before it was frozen?), "
                               "which torch.optim would apply: set its .grad to None (zero_grad "
                               "does) or build the optimizer with it trainable")

    # ---- weights changed in the model ---------------------------------------------------------
    def _record_versions(self):
        """torch's version counter of each trainable parameter: every in-place write through the
        parameter (copy_, model.load_state_dict, torch.nn.init) moves it; tierswap's own writes
        (the step's, load's, import_state's) go to the memory underneath and do not."""
        self._versions = [p._version for p, _ in self._ids]

    def _any_rank_each(self, flags):
        """Flag by flag, whether any rank raised it (this rank's flags at world size 1)."""
        if self._native.world() == 1 or not self._native.any_rank(any(flags)):
            return flags
        return self._native.any_rank_each(flags)

    def _adopt_changed_weights(self):
        """Parameters written in the model since the last step (model.load_state_dict after the
        optimizer was built, an in-place init, p.copy_): where the 16-bit value is no longer the
        rounding of its fp32 master, the new value becomes the master (moments and step count
        kept, as torch keeps them), instead of the next step putting the old weights back.
        Collective at world size > 1 (before the first hand-over of a step's backward)."""
        moved = [p._version != v for (p, _), v in zip(self._ids, self._versions)]
        moved = self._any_rank_each(moved)
        if not any(moved):
            return
        differs = [m and not torch.equal(self._gather(p, nid, "master").to(p.dtype)
                                         .view(torch.int16),
                                         self._dev.host_values(p).view(torch.int16))
                   for (p, nid), m in zip(self._ids, moved)]  # gather: collective
        named = [self._where(p) for (p, _), d in zip(self._ids, differs) if d]
        differs = self._any_rank_each(differs)  # every rank imports the same parameters
        keep = []
        items = [self._state_item(p, nid, "master", "master", p, keep)
                 for (p, nid), d in zip(self._ids, differs) if d]
        if items:
            self._native.import_state(items, None)
            self._warn_once("adopted", f"{', '.join(named[:3]) or 'parameters on another rank'}"
                            f"{' and others' if len(named) > 3 else ''} changed in the model "
                            "since the last step (model.load_state_dict, an in-place init or "
                            "copy_): the new values are taken as the fp32 master weights "
                            "(moments and step count kept). Said once")
        self._record_versions()

    # ---- hyper-parameters ---------------------------------------------------------------------
    def _group_hyper(self, gi, group):
        try:
            return self._hyper(group)
        except (ValueError, TypeError) as e:
            raise type(e)(f"param_groups[{gi}]: {e}") from None

    def _sync_groups(self):
        if len(self.param_groups) != len(self._group_ids):
            raise RuntimeError("param_groups changed length after construction")
        for gi, group in enumerate(self.param_groups):
            if [id(p) for p in group["params"]] != self._group_ids[gi]:
                raise RuntimeError(f"param_groups[{gi}]['params'] changed after construction: "
                                   "tierswap lays out its parameters once")
            h = self._group_hyper(gi, group)
            if h != self._hyper_sent[gi]:
                self._native.set_group(gi, self._kind, h)
                self._hyper_sent[gi] = h

    # ---- gradients ----------------------------------------------------------------------------
    def _checked_grad(self, p, nid):
        """p.grad as tierswap takes it (contiguous), or None; a gradient it cannot take raises."""
        g = p.grad
        if g is None:
            return None
        if g.is_sparse:
            raise TypeError(f"the gradient of parameter {nid} (shape {tuple(p.shape)}) is sparse")
        if g.dtype not in _DTYPE_NAMES:
            raise TypeError(f"the gradient of parameter {nid} is {g.dtype}: tierswap takes "
                            "bfloat16, float16 or float32 gradients")
        # torch's p.grad setter refuses another shape (and device) already: the size the native
        # side reads is checked, against the parameter's as registered (shapes, or a
        # Parameter's numel(), cost 0.3-0.4 us per parameter at every step).
        if g.is_cpu != self._dev.grads_on_cpu or g.numel() != self._numel[nid]:
            raise ValueError(f"the gradient of parameter {nid} is {tuple(g.shape)} on {g.device} "
                             f"for a {tuple(p.shape)} {self._dev.describe(p)} parameter")
        return g if g.is_contiguous() else g.contiguous()

    def _hand_over(self, p, nid):
        """A hook's hand-over: p.grad copied into tierswap, then freed. One native call at a
        time (the lock; re-entrant for _begin), starting the backward if this is its first."""
        with self._lock:
            if not self._in_backward:
                self._begin(self._final if self._auto is None else self._guess_final())
            g = self._checked_grad(p, nid)
            if g is not None:
                try:
                    self._dev.add_grad(self._native, nid, g)
                except BaseException:
                    # the tiers could not take it: the native side abandoned the backward
                    # (every gradient since the last step dropped, this one too); the next
                    # backward begins anew
                    self._in_backward = self._native.in_backward()
                    if not self._in_backward:
                        p.grad = None
                        self._handed.clear()
                    raise
                self._handed.add(nid)
        p.grad = None

    def _guess_final(self):
        """The default mode's backward begun by a hook (outside micro_batch): ended when torch's
        backward pass ends; the last before step() when it is as many passes into the step as
        the step before had."""
        self._backwards += 1
        torch.autograd.Variable._execution_engine.queue_callback(self._end)
        return self._backwards >= self._per_step

    def _settle_auto(self):
        """After a step of the default mode: counts its backward passes and, after the first
        step, chooses hooks and overlap for the rest of the run."""
        self._per_step, self._backwards = max(1, self._backwards), 0
        if self._auto == "first step":
            if self._reads_grads or self._native.world() > 1:
                self._auto = "off"  # as hooks=False: p.grad is there between backward and step
                return
            self._auto, self._hooks = "on", True
        if self._auto == "on" and self._overlap_auto:
            # A step that clips redoes what was stepped during the backward (the factor is known
            # once every gradient is): overlapped while the step before did not clip.
            clipped = 0 < self._max_grad_norm <= self.last_step["grad_norm"]
            if self._native.overlap() == clipped:
                self._native.set_overlap(not clipped)

    def _lend_grads(self):
        """Lends every p.grad (step-time hand-over: the step reads them in place); returns them,
        for the caller to keep alive until the step is done. Called by _step(), under the lock."""
        lent, refs = [], []
        for p, nid in self._ids:
            g = self._checked_grad(p, nid)
            if g is not None:
                lent.append((p, g))
                refs.append((nid, g.data_ptr(), _DTYPE_NAMES[g.dtype], g.numel()))
        if self._dev.lends:
            self._native.lend_grads(refs)
        else:  # from device memory: copied over now, in the accumulation dtype's blocks
            for (_, g), (nid, *_) in zip(lent, refs):
                self._dev.add_grad(self._native, nid, g)
        self._handed.update(r[0] for r in refs)
        return lent

    @one_at_a_time
    def _begin(self, final):
        self._trainer = threading.get_ident()  # (see settled)
        self._sync_groups()
        self._adopt_changed_weights()
        self._native.begin_backward(final)
        self._in_backward = True

    @one_at_a_time
    def _end(self):
        if self._in_backward:
            self._in_backward = False
            if self._native.in_backward():  # else a failed hand-over abandoned it already
                self._native.end_backward()

    @contextlib.contextmanager
    def micro_batch(self, final=True):
        """With hooks=True, wrap each backward of a step: ``final=False`` for all but the last
        micro-batch (gradient accumulation), so the overlapped step knows when gradients are final.
        Without hooks it does nothing (torch accumulates p.grad and step() hands it over)."""
        if not self._hooks:
            yield
            return
        self._end()
        self._final = bool(final)
        self._begin(self._final)
        try:
            yield
        finally:
            self._end()
            self._final = True

    def _install_hooks(self, pairs):
        for p, nid in pairs:
            def hook(*_, p=p, nid=nid):
                if self._hooks:  # (the default mode's first step hands over at step())
                    self._hand_over(p, nid)
            if hasattr(p, "register_post_accumulate_grad_hook"):  # torch >= 2.1
                self._handles.append(p.register_post_accumulate_grad_hook(lambda _p, h=hook: h()))
            else:  # torch 1.13: the AccumulateGrad node's post-hook runs once p.grad is updated
                node = p.expand_as(p).grad_fn.next_functions[0][0]
                self._handles.append((node, node.register_hook(hook)))

    # ---- the step ------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:  # outside the lock: its backward's hooks take it themselves
            with torch.enable_grad():
                loss = closure()
        self._step()
        return loss

    @one_at_a_time
    def _step(self):
        t0 = time.perf_counter()
        lent, problem = [], None  # lent: gradients the step reads in place, alive until it returns
        try:
            self._check_storage()
            self._check_frozen()
            if not self._hooks:
                self._begin(True)
                lent = self._lend_grads()
            elif any(p.grad is not None for p, _ in self._ids):  # set by hand, not by a backward
                if not self._in_backward:
                    self._begin(True)
                lent = self._lend_grads()
        except BaseException as e:  # every rank learns of it, below
            problem = e
        try:  # every rank, before end_backward() (a collective without coalescing) and the step
            self._agree(problem, "step")
        except BaseException:
            if not self._in_backward:
                self._begin(True)  # every rank ends one backward pass
            self._end()
            self._native.drop_grads()  # none half handed over (nor lent past this call)
            self._handed.clear()
            raise
        self._end()
        try:
            if self._leave_alone_those_without_grad():
                self._run_native_step(lent, time.perf_counter() - t0)
                # What the trainer waited for: the whole call (hand-over, the previous step's
                # commit still landing, the step); with hooks, not what ran during the backward.
                self.last_step["exposed_seconds"] = time.perf_counter() - t0
                if self._auto is not None:
                    self._settle_auto()
        finally:
            self._handed.clear()
            self._record_versions()

    def _leave_alone_those_without_grad(self):
        """torch.optim steps only the parameters whose .grad is not None: the others (frozen
        after construction, unused by this step's forward) keep their weights and state. Every
        rank agrees (a parameter with a gradient on any rank steps). False: no parameter has a
        gradient anywhere, and the step does nothing, as torch's."""
        had = self._any_rank_each([nid in self._handed for _, nid in self._ids])
        if not any(had):
            self._native.drop_grads()
            self._warn_once("no grads", "step(): no parameter has a gradient (no backward since "
                            "the last step, or every parameter frozen or unused): nothing was "
                            "stepped, as torch.optim steps nothing. Said once")
            return False
        left = [nid for (_, nid), h in zip(self._ids, had) if not h]
        if left:
            self._native.leave_alone(left)
        return True

    def _run_native_step(self, lent, handover):
        clip, self._clip_factor = self._clip_factor, None
        self.last_step = self._native.step(clip)  # p (aliasing param16) now holds the new values
        self.last_step["handover_seconds"] = handover
        self.last_step["skip_reason"] = (
            f"non-finite gradient (inf or nan); loss scale {self.last_step['loss_scale']:g} -> "
            f"{self.last_step['next_loss_scale']:g}" if self.last_step["skipped"] else None)
        if self.last_step["skipped"] and not self._scaled:
            bad = next((self._where(p) for p, g in lent if not bool(torch.isfinite(g).all())),
                       None)
            which = (f"the gradient of {bad} is" if bad else "a gradient is" if self._hooks
                     else "a gradient on another rank is")
            warnings.warn(f"step {self.last_step['step'] + 1} skipped: {which} not finite (inf or "
                          "nan). torch.optim would have written it into the weights; tierswap "
                          "leaves weights and state as they were. Look for the cause "
                          "(torch.autograd.set_detect_anomaly), or train fp16 with "
                          "loss_scale='dynamic'", stacklevel=_user_level())

    @torch.no_grad()
    @one_at_a_time
    def clip_grad_norm_(self, parameters, max_norm, norm_type=2.0):
        """``torch.nn.utils.clip_grad_norm_`` for this optimizer, to put where a torch recipe calls
        it (between the backward and step()): the total norm of the parameters' gradients and
        the clip coefficient computed as torch computes them, in fp32 and in torch's order, on
        fp32 copies of the gradients (what the mixed-precision recipe clips: its fp32 master
        gradients). The next step() applies the coefficient inside the fused kernel, as torch's
        ``g.mul_(coef)`` on fp32 gradients would, so a bf16 recipe is reproduced bit for bit.
        Returns the total norm (a tensor), as torch does. Takes ``p.grad`` as it is now: it
        needs step-time hand-over (hooks=False), max_grad_norm=0 (the native clipping, whose
        norm is the same at any world size) and one process (ranks hold local gradients)."""
        if self._hooks:
            how = ("hooks, on by default from the second step as the first did not clip this "
                   "way: build with hooks=False to clip as torch does, or" if self._auto else
                   "hooks=True:")
            raise RuntimeError(f"clip_grad_norm_ reads p.grad before step(); with {how} the "
                               "gradients were handed over and freed during the backward: clip "
                               "with max_grad_norm instead")
        self._reads_grads = True
        if self._max_grad_norm > 0:
            raise RuntimeError(f"clip_grad_norm_ with max_grad_norm={self._max_grad_norm} set: "
                               "the gradients would be clipped twice (construct with "
                               "max_grad_norm=0 to clip as torch does)")
        if self._native.world() > 1:
            raise RuntimeError("clip_grad_norm_ needs the global gradients, and each of the "
                               f"{self._native.world()} ranks holds its local ones: clip with "
                               "max_grad_norm (its norm is the same at any world size)")
        if isinstance(parameters, torch.Tensor):
            parameters = [parameters]
        grads = [p.grad for p in parameters if p.grad is not None]
        max_norm = check.number("max_norm", max_norm)
        norm_type = check.number("norm_type", norm_type)
        if not (max_norm > 0):
            raise ValueError(f"clip_grad_norm_: max_norm {max_norm} must be > 0")
        if not grads:
            return torch.tensor(0.0)
        fp32 = [g.detach().float() for g in grads]
        if norm_type == math.inf:
            norms = [g.abs().max() for g in fp32]
            total = norms[0] if len(norms) == 1 else torch.max(torch.stack(norms))
        else:
            total = torch.norm(torch.stack([torch.norm(g, norm_type) for g in fp32]), norm_type)
        coef = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))
        # 0 or NaN: the fp32 norm is inf or NaN. A non-finite gradient makes step() skip; finite
        # gradients whose fp32 norm overflowed (above 3.4e38) step unclipped, where torch would
        # zero them.
        self._clip_factor = coef if math.isfinite(coef) and coef > 0 else None
        return total

    @one_at_a_time
    def zero_grad(self, set_to_none=True):
        self._clip_factor = None  # it was these gradients'
        if self._hooks and self._closer.alive:
            # The gradients the hooks handed over are tierswap's now: forgotten, as torch's
            # zero_grad forgets p.grad (a backward, zero_grad, a backward, step: the second only).
            self._end()
            self._native.drop_grads()
            self._handed.clear()
            self._backwards = 0
        super().zero_grad(set_to_none=set_to_none)

    @property
    def grad_norm(self):
        """The global norm of the last step's unscaled gradients, as ``clip_grad_norm_`` returns
        it."""
        return None if self.last_step is None else self.last_step["grad_norm"]

    @property
    def loss_scale(self):
        """Multiply the loss by this before backward (1.0 without loss scaling)."""
        return self._native.loss_scale()

    def scale_loss(self, loss):
        return loss * self._native.loss_scale()

    @property
    @one_at_a_time
    def step_count(self):
        return self._native.step_count()

    # ---- state ---------------------------------------------------------------------------------
    def _agree(self, problem, what):
        check.agree_on(problem, self._native.world(), self._native.any_rank,
                       f"{what}: another rank refused its arguments (its error says why); "
                       "nothing changed")

    @one_at_a_time
    def residency(self):
        """What `tierswap residency --json` shows for this process: tiers, classes, blocks."""
        return json.loads(self._native.residency_json())

    @one_at_a_time
    def close(self):
        """Frees the tiers and removes the swap files (also done when the optimizer is
        collected)."""
        for h in self._handles:
            (h[1] if isinstance(h, tuple) else h).remove()
        self._handles = []
        self._closer()

    def __getstate__(self):
        raise TypeError("a tierswap optimizer cannot be pickled: use state_dict() or save()")


class AdamW(_TieredOptimizer):
    """torch.optim.AdamW on the tiers (decoupled weight decay)."""

    _kind = "adamw"
    _state_keys = (("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq"),
                   ("max_exp_avg_sq", "max_exp_avg_sq"))

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, **tier):
        _reject_torch_only(tier)
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                        maximize=maximize)
        super().__init__(params, defaults, **tier)

    @staticmethod
    def _hyper(group):
        b1, b2 = check.pair("betas", group["betas"])
        return {"lr": check.num(group, "lr"), "beta1": b1, "beta2": b2,
                "eps": check.num(group, "eps"), "weight_decay": check.num(group, "weight_decay"),
                "amsgrad": bool(group["amsgrad"]), "maximize": bool(group.get("maximize", False))}

    @staticmethod
    def _apply_native(group, n):
        group.update(lr=n["lr"], betas=(n["beta1"], n["beta2"]), eps=n["eps"],
                     weight_decay=n["weight_decay"], amsgrad=n["amsgrad"], maximize=n["maximize"])
        return AdamW._hyper(group)

    def _state_keys_for(self, p):
        amsgrad = self._group_of(p)["amsgrad"]
        return [kc for kc in self._state_keys if amsgrad or kc[0] != "max_exp_avg_sq"]


class Adam(AdamW):
    """torch.optim.Adam on the tiers (L2 weight decay added to the gradient)."""

    _kind = "adam"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, *, maximize=False, **tier):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, maximize=maximize, **tier)


class SGD(_TieredOptimizer):
    """torch.optim.SGD on the tiers (momentum, dampening, nesterov, L2 weight decay)."""

    _kind = "sgd"
    _state_keys = (("momentum_buffer", "momentum"),)

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, *, maximize=False, **tier):
        _reject_torch_only(tier)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                        nesterov=nesterov, maximize=maximize)
        super().__init__(params, defaults, **tier)

    @staticmethod
    def _hyper(group):
        return {"lr": check.num(group, "lr"), "momentum": check.num(group, "momentum"),
                "dampening": check.num(group, "dampening"),
                "weight_decay": check.num(group, "weight_decay"),
                "nesterov": bool(group["nesterov"]),
                "maximize": bool(group.get("maximize", False))}

    @staticmethod
    def _apply_native(group, n):
        group.update(lr=n["lr"], momentum=n["momentum"], dampening=n["dampening"],
                     weight_decay=n["weight_decay"], nesterov=n["nesterov"], maximize=n["maximize"])
        return SGD._hyper(group)

    def _state_keys_for(self, p):
        return self._state_keys if self._group_of(p)["momentum"] != 0 else ()


class Lion(_TieredOptimizer):
    """Lion (Chen et al. 2023; lion-pytorch's defaults) on the tiers."""

    _kind = "lion"
    _state_keys = (("exp_avg", "exp_avg"),)

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, *, maximize=False,
                 **tier):
        _reject_torch_only(tier)
        defaults = dict(lr=lr, betas=betas, weight_decay=weight_decay, maximize=maximize)
        super().__init__(params, defaults, **tier)

    @staticmethod
    def _hyper(group):
        b1, b2 = check.pair("betas", group["betas"])
        return {"lr": check.num(group, "lr"), "beta1": b1, "beta2": b2,
                "weight_decay": check.num(group, "weight_decay"),
                "maximize": bool(group.get("maximize", False))}

    @staticmethod
    def _apply_native(group, n):
        group.update(lr=n["lr"], betas=(n["beta1"], n["beta2"]), weight_decay=n["weight_decay"],
                     maximize=n["maximize"])
        return Lion._hyper(group)


# ---- keyword checks ---------------------------------------------------------------------------
_TIER_KEYWORDS = {"swap_dir", "host_budget", "state_tier", "subgroup_size", "overlap", "plan",
                  "max_grad_norm", "loss_scale", "init_scale", "growth_factor", "backoff_factor",
                  "growth_interval", "bf16_moments", "accumulate_fp32", "telemetry", "hooks",
                  "threads", "communicator", "keep_swap_files", "swap_capacity",
                  "persist_resident_state", "durable", "resume", "service", "service_job",
                  "device_tier", "pipelined_commit"}
# torch.optim implementation switches: accepted and ignored (tierswap has one implementation).
_TORCH_SWITCHES = {"foreach", "fused", "capturable", "differentiable"}


def _hooks_by_default(dev):
    """Whether hooks=None hands gradients over during the backward (from the second step):
    for parameters on a device (a GPU, or the simulated device tier standing in for one), whose
    gradients are copied to host memory anyway and whose backward runs on the device, leaving
    the CPU to hand over and step meanwhile. Not for CPU parameters: their backward and the
    step share the cores, and step() reads p.grad in place (no copy); there the hooks' copies
    and the overlapped step slowed the small model's training with NVMe state to 0.74-0.80x
    the in-memory recipe's tokens/s, against 0.95-0.98x handed over at step()
    (bench/torch_step.py tinylm, widths 256 and 512, 2 cores)."""
    return not dev.lends


def _shadow_slots():
    """Whether the tier manager keeps shadow slots (TIERSWAP_SHADOW, default on): the
    overlapped step's discard needs them, so without them the default leaves it off."""
    return os.environ.get("TIERSWAP_SHADOW") != "0"  # "0" or "1" (anything else: refused)


def _user_level():
    """warnings.warn's stacklevel, from its caller, of the first frame outside the optimizer's
    modules and torch (the decorators of step()): the user's line."""
    f, level = sys._getframe(1), 1
    while f is not None and (f.f_code.co_filename in _OWN_FILES
                             or f.f_code.co_filename.startswith(_TORCH_DIR)):
        f, level = f.f_back, level + 1
    return level


def _reject_torch_only(tier):
    for k in list(tier):
        if k in _TORCH_SWITCHES:
            tier.pop(k)
        elif k not in _TIER_KEYWORDS:
            raise TypeError(f"unknown keyword argument '{k}' (tier keywords: "
                            f"{', '.join(sorted(_TIER_KEYWORDS))})")


def _temporary(swap_dir):
    """Whether the optimizer makes its own temporary swap directory (no swap_dir, and no
    TIERSWAP_SWAP_DIRS)."""
    return swap_dir is None and not os.environ.get("TIERSWAP_SWAP_DIRS")


def _agree_before_native(comm, problem):
    """The checks before the native constructor are this rank's own, and the constructor's first
    agreement is a collective: over `comm` (torch.distributed's or MPI's) the ranks agree on them
    first."""
    check.agree_on(problem, 1 if comm is None else comm.size(),
                   None if comm is None else comm.all_reduce_or,
                   "optimizer setup: another rank refused its arguments (its error says why); "
                   "nothing was made")


def _swap_dirs(swap_dir):
    """The swap directories, and a temporary one to remove at close() when none was given."""
    if _temporary(swap_dir):
        tmp = TempSwapDir()
        return [tmp.path], tmp
    if swap_dir is None:
        return [d for d in os.environ["TIERSWAP_SWAP_DIRS"].split(":") if d], None
    # What a directory must be (present, a directory, not a symlink, writable) the native side
    # checks (TieredOptimizer), as a ValueError naming it.
    dirs = [swap_dir] if isinstance(swap_dir, (str, os.PathLike)) else list(swap_dir)
    for d in dirs:
        if not isinstance(d, (str, os.PathLike)):
            raise TypeError(f"swap_dir: {d!r} is not a path")
    return [os.fspath(d) for d in dirs], None


def from_deepspeed_config(params, config, **overrides):
    """A tierswap optimizer from a DeepSpeed config (a dict or a JSON file path). See
    tierswap.deepspeed.map_config for what is mapped; keys without an equivalent are named in a
    warning."""
    from .deepspeed import map_config
    kind, kwargs = map_config(config)
    kwargs.update(overrides)
    cls = {"adamw": AdamW, "adam": Adam, "sgd": SGD, "lion": Lion}[kind]
    return cls(params, **kwargs)
