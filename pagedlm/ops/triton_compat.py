"""A work-around for the Triton interpreter (TRITON_INTERPRET=1), applied when a kernel module imports.

Triton 3.6's interpreter turns a scalar tensor into an int with `int(ndarray_of_shape_1)`, which
numpy >= 2.4 refuses ("only 0-dimensional arrays can be converted to Python scalars"), so a
`for i in range(lo, hi, STEP)` with run-time bounds fails there (triton-lang/triton#9171, fixed
after 3.6). The patched function is used by the interpreter only: compiled kernels are unaffected.
"""

from __future__ import annotations

from triton.runtime import interpreter


def patch_interpreter() -> None:
    """Make scalar tensors usable as loop bounds in the interpreter (idempotent)."""
    original = interpreter._patch_lang_tensor
    if getattr(original, "pagedlm_patched", False):
        return

    def patch_lang_tensor(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    patch_lang_tensor.pagedlm_patched = True
    interpreter._patch_lang_tensor = patch_lang_tensor
