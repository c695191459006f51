"""A tierswap.torch optimizer's state as torch reads and writes it (opt.state, state_dict(),
load_state_dict()) and tierswap's own checkpoint of it (save(), load())."""

import os
import warnings
import weakref
from collections.abc import Mapping

import torch

from . import _checks as check
from ._serial import one_at_a_time, settled


class StateView(Mapping):
    """``opt.state``: each trainable parameter's state as torch's optimizer would hold it
    (``step`` and the moments), read from the tiers when a parameter is looked up. The tensors
    are copies: the view is read-only (set state through ``load_state_dict``). Before the first
    step it is empty, as torch's is (a parameter's lookup gives ``{}``): there is no state yet,
    and torch starts some from the first gradient, not from zeros (SGD's momentum buffer). At
    world size > 1 a lookup would gather from every rank, so it is refused: ``state_dict()`` is
    the collective."""

    def __init__(self, opt):
        self._opt = weakref.ref(opt)  # the optimizer holds the view, not the other way round

    def _params(self):
        opt = self._opt()
        return [] if opt is None else [p for p, _ in opt._ids if opt._has_state(p)]

    def __getitem__(self, p):
        opt = self._opt()
        nid = None if opt is None else opt._nid_of.get(id(p))
        if nid is None:
            raise KeyError("not a trainable parameter of this optimizer")
        return opt._param_state(p, nid) if opt._has_state(p) else {}

    def __contains__(self, p):
        opt = self._opt()
        return opt is not None and id(p) in opt._nid_of and opt._has_state(p)

    def __iter__(self):
        return iter(self._params())

    def __len__(self):
        return len(self._params())

    def __setitem__(self, p, value):
        raise TypeError("opt.state is read from the tiers: set state through load_state_dict()")

    __delitem__ = __setitem__

    def __repr__(self):
        return f"<tierswap optimizer state of {len(self)} parameters, read from the tiers>"


class Checkpointing:
    """The state's readers and writers of _TieredOptimizer, which sets what they use: _native,
    _ids, _nid_of, _group_at, _state_keys, _tmpdir, _hyper_sent, _apply_native() and _agree()."""

    def _index(self):
        """torch's state-dict index of each parameter (all groups, in order)."""
        out, i = {}, 0
        for group in self.param_groups:
            for p in group["params"]:
                out[id(p)] = i
                i += 1
        return out

    def _gather(self, p, nid, cls):
        t = torch.empty(p.shape, dtype=torch.float32)
        self._native.gather(nid, cls, t.data_ptr(), t.numel())
        return t

    def _group_step(self, p):
        """The steps parameter p's group took (torch counts per parameter; tierswap per group:
        a group added between steps starts at 0)."""
        return self._native.group_step_count(self._group_at[id(p)])

    def _has_state(self, p):
        """Whether p's group took a step (or state was loaded at a step): before, torch's state
        for p is empty."""
        return self._group_step(p) > 0

    @settled("state_dict()")
    def state_dict(self):
        """torch's format, the state materialized from the tiers: {'state': {index: {'step',
        moments}}, 'param_groups': [...]}, plus 'master_params': {index: fp32 master weights}
        (a key torch.optim's load_state_dict ignores). Before the first step 'state' is empty,
        as torch's is."""
        index = self._index()
        state, masters = {}, {}
        for p, nid in self._ids:
            i = index[id(p)]
            if self._has_state(p):
                state[i] = self._param_state(p, nid, collective=True)
            masters[i] = self._gather(p, nid, "master")
        groups = []
        for group in self.param_groups:
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = [index[id(p)] for p in group["params"]]
            groups.append(g)
        return {"state": state, "param_groups": groups, "master_params": masters}

    @settled("opt.state[p]")
    def _param_state(self, p, nid, collective=False):
        """Parameter p's entry of torch's state: step and moments, gathered from the tiers."""
        if not collective and self._native.world() > 1:
            raise RuntimeError(f"opt.state[p] would gather from every one of the "
                               f"{self._native.world()} ranks: call state_dict() on every rank")
        entry = {"step": torch.tensor(float(self._group_step(p)))}
        for key, cls in self._state_keys_for(p):
            entry[key] = self._gather(p, nid, cls)
        return entry

    def _state_keys_for(self, p):
        """The states parameter p keeps under its group's settings."""
        return self._state_keys

    def _group_of(self, p):
        gi = self._group_at.get(id(p))
        if gi is None:
            raise KeyError("parameter not in this optimizer")
        return self.param_groups[gi]

    @one_at_a_time
    def load_state_dict(self, state_dict):
        """Takes torch's format (from this class or from the matching torch.optim optimizer):
        hyper-parameters, step and moments; master weights from 'master_params' when present,
        else the current ones are kept. Bit-exact on fp32 state. Collective at world size > 1: a
        rank that refuses its state dict makes every rank raise, and nothing changes."""
        before = [dict(g) for g in self.param_groups]
        try:
            problem = None
            try:
                items, step, keep = self._checked_import(state_dict)  # keep: what items point to
                for mine, theirs in zip(self.param_groups, state_dict["param_groups"]):
                    mine.update({k: v for k, v in theirs.items() if k != "params"})
                self._sync_groups()
            except (ValueError, TypeError, KeyError, RuntimeError) as e:
                problem = e
            self._agree(problem, "load_state_dict")
            self._native.import_state(items, *step)
            del keep
        except BaseException:  # the groups as they were (state is imported whole or not at all)
            for mine, old in zip(self.param_groups, before):
                mine.clear()
                mine.update(old)
            self._sync_groups()
            raise

    def _checked_import(self, state_dict):
        """load_state_dict()'s checks: the native items to import, the step count, and the
        tensors the items point to."""
        check.optimizer_state_dict(state_dict)
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"state dict has {len(groups)} param groups, this optimizer "
                             f"{len(self.param_groups)}")
        for gi, (mine, theirs) in enumerate(zip(self.param_groups, groups)):
            if len(mine["params"]) != len(theirs["params"]):
                raise ValueError(f"param group {gi}: {len(theirs['params'])} parameters in the "
                                 f"state dict, {len(mine['params'])} here")
        by_saved = {}
        for mine, theirs in zip(self.param_groups, groups):
            by_saved.update(zip(theirs["params"], mine["params"]))
        ids = {id(p): nid for p, nid in self._ids}
        items, keep, steps = [], [], {}  # steps: {group index: the steps its parameters took}
        masters = state_dict.get("master_params", {})
        for saved, st in state_dict["state"].items():
            p = by_saved.get(saved)
            if p is not None and p.numel() == 0:
                continue  # torch's empty moments for an empty parameter: nothing to hold
            if p is None or id(p) not in ids:
                raise ValueError(f"state dict holds state for parameter {saved}, which is not a "
                                 "trainable parameter here")
            needed = self._state_keys_for(p)
            self._check_state_keys(saved, st, needed)
            if "step" in st:
                count = check.step_count(st["step"], saved)
                steps.setdefault(self._group_at[id(p)], set()).add(count)
            for key, cls in needed:
                if st.get(key) is not None:
                    items.append(self._state_item(p, ids[id(p)], key, cls, st[key], keep))
            if saved in masters:
                items.append(self._state_item(p, ids[id(p)], "master", "master", masters[saved],
                                              keep))
        step = self._step_counts(steps)
        self._warn_stateless(state_dict["state"], by_saved, step[0])
        return items, step, keep

    def _step_counts(self, steps):
        """import_state's step count and per-group counts from {group: steps of its parameters}:
        one count for all when the groups agree (a torch dict of one run), else one per group (a
        group without state keeps its own)."""
        for gi, s in steps.items():
            if len(s) > 1:
                raise ValueError(f"param group {gi}: parameters at different steps {sorted(s)}: "
                                 "tierswap keeps one step count per group")
        counts = {gi: s.pop() for gi, s in steps.items()}
        if len(set(counts.values())) <= 1:
            return (next(iter(counts.values()), None), [])
        per = [counts.get(gi, self._native.group_step_count(gi))
               for gi in range(len(self.param_groups))]
        return (max(per), per)

    def _check_state_keys(self, saved, st, needed):
        """A key this kind's state never has (the dict of another optimizer: torch would take
        an AdamW dict into SGD and fail at its step; tierswap would mix the two), or one that
        the parameter's group needs and the entry lacks (a partial dict: torch fails at its
        next step; tierswap would keep the current value of that state beside the loaded ones)."""
        known = [k for k, _ in self._state_keys]
        stray = sorted(k for k in st if k != "step" and k not in known)
        if stray:
            raise ValueError(f"state dict holds {', '.join(map(repr, stray))} for parameter "
                             f"{saved}, which {type(self).__name__}'s state does not have (it "
                             f"has {', '.join(known)}): the state dict of another kind of "
                             "optimizer?")
        absent = [k for k, _ in needed if k not in st]
        if absent:
            has = ", ".join(map(repr, st)) or "nothing"
            raise ValueError(f"state dict has no {', '.join(map(repr, absent))} for parameter "
                             f"{saved} (it has {has}), which {type(self).__name__}'s state for "
                             "its group needs: a partial state dict? (nothing was loaded)")

    def _warn_stateless(self, saved_state, by_saved, step):
        """Trainable parameters the state dict holds no state for (torch's dict of a parameter
        that never had a gradient): torch would start them afresh, tierswap keeps their state
        and its one step count. Said, not refused: the common case is a fresh optimizer."""
        have = {id(by_saved[k]) for k in saved_state if k in by_saved}
        index = self._index()
        missing = [index[id(p)] for p, _ in self._ids if id(p) not in have]
        step = self._native.step_count() if step is None else step  # after the load
        if missing and step > 0:
            warnings.warn(f"load_state_dict: no state for trainable parameter(s) {missing}: "
                          "tierswap keeps their current state and steps them at the common step "
                          f"count ({step}), where torch.optim would start them afresh at step 0",
                          stacklevel=5)

    @staticmethod
    def _state_item(p, nid, key, cls, value, keep):
        if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(p.shape):
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise ValueError(f"state '{key}' of parameter {nid}: {shape} for a "
                             f"{tuple(p.shape)} parameter")
        t = value.detach().to(device="cpu", dtype=torch.float32).contiguous()
        keep.append(t)
        return (nid, cls, t.data_ptr(), t.numel())

    @settled("save()")
    def save(self, path):
        """tierswap's native checkpoint (the state stays on the tiers: nothing is materialized);
        loads at any world size with load(). Collective: a rank that refuses its path makes every
        rank raise, and nothing is written."""
        try:
            problem = None
            self._check_save_path(path)
        except (OSError, ValueError) as e:
            problem = e
        self._agree(problem, f"save({os.fspath(path)!r})")
        self._native.save(os.fspath(path))

    def _check_save_path(self, path):
        if os.path.exists(path) and not os.path.isdir(path):
            raise NotADirectoryError(f"save({os.fspath(path)!r}): not a directory (a checkpoint "
                                     "is one)")
        if self._tmpdir is not None:
            tmp, real = os.path.realpath(self._tmpdir.path), os.path.realpath(path)
            if os.path.commonpath([tmp, real]) == tmp:
                raise ValueError(f"save({os.fspath(path)!r}): inside this optimizer's temporary "
                                 f"swap directory {tmp}, which close() removes: save elsewhere")
        os.makedirs(path, exist_ok=True)

    @one_at_a_time
    def load(self, path):
        """Restores a save() checkpoint: state, step, loss scaler and hyper-parameters."""
        self._native.load(os.fspath(path))
        for gi, group in enumerate(self.param_groups):
            native = self._native.group(gi)
            self._hyper_sent[gi] = self._apply_native(group, native)
