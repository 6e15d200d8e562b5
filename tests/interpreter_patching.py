"""Triton's interpreter, without repeating its language patching at every device-function call.

Under TRITON_INTERPRET=1 a launch patches `triton.language` (every builtin rebound to a NumPy-backed
implementation) once, runs the grid, and restores it. But every call of a `@triton.jit` helper from inside
the kernel patches again (`InterpretedFunction.__call__` calls `_patch_lang`): `inspect.getmembers` over
`tl`, `tl.tensor`, `tl.math` and `tl.core`, about 1.5 ms a call. The split kernels call helpers (Philox, the
draft uniforms, the race) per tile and per program: in `test_triton_split_chain_equals_the_cpu_op` that was
18,700 calls and 27 s of its 76 s.

The repeat does nothing within a launch: builtins already rebound are skipped (the rebound ones are no longer
builtins), and the rest of the patching sets the same replacements again, which the launch's own restore
undoes in full. So, while a launch's patching is in force, a helper whose module sees only language modules
that launch patched skips it; a helper that sees another one (say `triton.language.core` imported on its
own) is patched as before. Triton 3.6 to 3.9 share this code (`_patch_lang` returning a `_LangPatchScope`
whose `restore` the launch calls in a `finally`); on any other shape nothing is changed. Results are
unchanged: the whole suite compares the Triton kernels with the C++ and reference ones either way.

Second, `_get_np_dtype` (the NumPy dtype of a Triton type, called for most operations the interpreter runs)
builds its table of 19 Triton types anew at every call, hashing each: in `test_second_sibling_after_a_rejection`
757,000 calls took 21 s of 162. Its answer depends only on the type, so it is remembered per type (types that
compare equal get the same answer: the table's own lookup is by equality). Same code in Triton 3.6 to 3.9.

Third, every 32-bit integer add, sub and mul (`x + 1` on an index, say) runs `binary_op_sanitize_overflow_impl`
after it: the operands cast to int64, the operation again, two compares and an and, all for a `device_assert`
that returns at once unless the interpreter's options have debug on (they do not: `InterpreterOptions.debug`
is False, and no launch changes it). Its result is dropped either way, so without debug it is skipped (the
CPU time of tests/test_logits.py, test_rejection.py and test_triton_tree_split.py: 672 s -> 533 s). With debug
on it runs as before. Only where both functions read as in Triton 3.6 and 3.8 (checked on their source).
"""

import inspect

_installed = False


def install() -> bool:
    """Install the shortcut in this process; True when it is in force (idempotent)."""
    global _installed
    if _installed:
        return True
    try:
        from triton.runtime import interpreter
    except Exception:
        return False
    original = getattr(interpreter, "_patch_lang", None)
    scope_cls = getattr(interpreter, "_LangPatchScope", None)
    tl = getattr(interpreter, "tl", None)
    if original is None or scope_cls is None or tl is None or not hasattr(scope_cls, "restore"):
        return False

    patched = None  # the language modules patched by the launch in progress (None: no launch in progress)
    seen = {}    # within that launch: id of a helper's globals -> the language modules they hold

    def lang_modules(fn):
        key = id(fn.__globals__)
        if key not in seen:
            seen[key] = {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}
        return seen[key]

    class _Nothing:
        def restore(self) -> None:
            pass

    def patch_lang(fn):
        nonlocal patched
        langs = lang_modules(fn)
        if patched is not None and langs and langs <= patched:
            return _Nothing()  # a device-function call inside a launch that patched these already
        scope = original(fn)
        if patched is not None:
            patched |= langs  # a helper that brought another language module: patched above, kept
            return scope
        seen.clear()
        patched = set(langs)
        restore = scope.restore

        def restore_and_end():
            nonlocal patched
            try:
                restore()
            finally:
                patched = None
                seen.clear()

        scope.restore = restore_and_end
        return scope

    interpreter._patch_lang = patch_lang
    _remember_np_dtypes(interpreter)
    _skip_overflow_checks_without_debug(interpreter)
    _installed = True
    return True


def _remember_np_dtypes(interpreter) -> None:
    """interpreter._get_np_dtype with its answers remembered (see the module docstring). The original answers
    a block type by its element type and every pointer type (scalar or element) alike, so those are the keys:
    block types are not hashable."""
    original = getattr(interpreter, "_get_np_dtype", None)
    tl = getattr(interpreter, "tl", None)
    if original is None or not hasattr(tl, "block_type") or not hasattr(tl, "pointer_type"):
        return
    block_type, pointer_type = tl.block_type, tl.pointer_type
    answers = {}

    def get_np_dtype(tt_dtype):
        key = tt_dtype.element_ty if isinstance(tt_dtype, block_type) else tt_dtype
        if isinstance(key, pointer_type):
            key = pointer_type
        try:
            return answers[key]
        except KeyError:
            answer = answers[key] = original(tt_dtype)
            return answer
        except TypeError:  # not hashable: none of Triton's scalar types; the original says what it makes of it
            return original(tt_dtype)

    get_np_dtype.original = original
    interpreter._get_np_dtype = get_np_dtype


def _skip_overflow_checks_without_debug(interpreter) -> None:
    """interpreter_semantic.binary_op_sanitize_overflow_impl returns at once while the interpreter's options have
    debug off (see the module docstring): its only effect is its device_assert's, which without debug returns
    before doing anything. Installed only where the two functions' source says so (Triton 3.6 and 3.8 read it)."""
    semantic = getattr(interpreter, "interpreter_semantic", None)
    original = getattr(semantic, "binary_op_sanitize_overflow_impl", None)
    device_assert = getattr(semantic, "device_assert", None)
    if original is None or device_assert is None or not hasattr(semantic, "builder"):
        return
    try:
        check = [line.strip() for line in inspect.getsource(original).splitlines()[1:] if line.strip()]
        assert_ = [line.strip() for line in inspect.getsource(device_assert).splitlines()[1:] if line.strip()]
    except (OSError, TypeError):
        return
    # the check: no store, no builder call and no value returned; its last statement its device_assert, which
    # first of all returns without debug
    if (check[-1] != "self.device_assert(cond, msg, None)" or any(line.startswith("return ") for line in check)
            or any("store" in line or "self.builder.create" in line for line in check)
            or assert_[:2] != ["if not self.builder.options.debug:", "return"]):
        return

    def sanitize_overflow(lhs, rhs, binary_op):
        if not semantic.builder.options.debug:
            return None
        return original(lhs, rhs, binary_op)

    sanitize_overflow.original = original
    semantic.binary_op_sanitize_overflow_impl = sanitize_overflow
