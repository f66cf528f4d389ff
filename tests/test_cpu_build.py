"""The build of the CPU extension: every build switch setup.py documents is one it reads."""
import ast
import pathlib
import re

SETUP = pathlib.Path(__file__).resolve().parent.parent / "setup.py"


def test_documented_build_switches_are_read():
    """A ``QCONV_*`` variable named in setup.py's docstring must be looked up by its code (a string constant
    outside the docstring), so no documented switch silently does nothing."""
    tree = ast.parse(SETUP.read_text())
    doc = ast.get_docstring(tree)
    documented = set(re.findall(r"QCONV_[A-Z_]+", doc))
    assert "QCONV_SANITIZE" in documented
    body = tree.body[1:]   # the docstring is the first statement
    read = {node.value for stmt in body for node in ast.walk(stmt)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert documented <= read, f"documented but never read: {sorted(documented - read)}"
