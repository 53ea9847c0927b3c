"""A type from another package registers through the entry-point group.

A stub distribution (a ``dist-info`` folder with ``entry_points.txt`` and the module it
names, on ``sys.path``) advertises one class; :func:`load_entry_points` registers it,
and the command line, the sweeps and the solvers then see it. A broken entry point is
reported and skipped.
"""

import sys
import textwrap

import numpy as np
import pytest

import gaussian_pde as gp
from gaussian_pde.attention import ENTRY_POINT_GROUP, load_entry_points

MODULE = '''
import numpy as np
import gaussian_pde as gp
from gaussian_pde.attention import ParticleDiagnostics


class Halved(gp.Softmax):
    """Softmax with the value matrix halved: the field of softmax(Q, K, V / 2)."""

    name = "halved_stub"

    def weights(self):
        return self.Q, self.K, 0.5 * self.V, self.scale

    def particle_kernel(self, x, opts):
        v, diag = super().particle_kernel(x, opts)
        return 0.5 * v, diag

    @classmethod
    def jacobian_parts(cls, weights, L, mean=None):
        return gp.Softmax.jacobian_parts(weights, L, mean)

    def fused_term(self, with_mean, out=None):
        return gp.Attention.fused_term(self, with_mean, out)

    def fused_rhs(self, with_mean, out, counter):
        return None


NOT_A_TYPE = 42
'''


@pytest.fixture
def stub(tmp_path, monkeypatch):
    """A stub distribution with one good and one bad entry point, on ``sys.path``."""
    (tmp_path / "stub_attention.py").write_text(MODULE)
    info = tmp_path / "stub_attention-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: stub-attention\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(f"""\
        [{ENTRY_POINT_GROUP}]
        halved_stub = stub_attention:Halved
        broken = stub_attention:NOT_A_TYPE
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = dict(gp.ATTENTIONS)
    yield
    gp.ATTENTIONS.clear()
    gp.ATTENTIONS.update(saved)
    sys.modules.pop("stub_attention", None)


def test_entry_point_type_is_registered_and_used(stub):
    # the stub still defines the hooks of the earlier contract: accepted, with a warning
    with pytest.warns(RuntimeWarning, match="'broken'.*not a subclass"), \
            pytest.warns(DeprecationWarning, match="`fused_term`, `fused_rhs`, `jacobian_parts`"):
        added = load_entry_points()
    assert added == ["halved_stub"]
    cls = gp.get_attention("halved_stub")
    assert cls.exact_jacobian and cls.__module__ == "stub_attention"
    # the command line and the sweeps read the registry
    from gaussian_pde.cli._main import build_parser
    from gaussian_pde.sweep._spec import SweepSpec

    sub = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert "halved_stub" in next(a for a in sub["compare"]._actions
                                 if a.dest == "attention").choices
    assert SweepSpec(attention=["halved_stub"], dims=[2], draws=1).attention == ("halved_stub",)
    # the solvers: its field is softmax's with V / 2
    Q, K, V = np.array([[1.0, 0.5]]), np.array([[0.8, -0.2]]), np.eye(2)
    att, ref = cls(Q, K, V), gp.Softmax(Q, K, 0.5 * V)
    cov0 = np.array([[1.0, 0.3], [0.3, 0.6]])
    a = gp.solve(att, np.ones(2), cov0, (0.0, 0.5), t_eval=[0.5])
    b = gp.solve(ref, np.ones(2), cov0, (0.0, 0.5), t_eval=[0.5])
    np.testing.assert_allclose(a.cov, b.cov, rtol=1e-8)
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-8)
    bat = gp.solve_batch([att], cov0[None], (0.0, 0.5), t_eval=[0.5])
    np.testing.assert_allclose(bat.cov[0][-1], b.cov[-1], rtol=1e-7)
    # loading again registers nothing new
    with pytest.warns(RuntimeWarning):
        assert load_entry_points() == []
