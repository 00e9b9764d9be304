"""Every hint that installs one of the package's extras, in code, tests and docs, has the README's one form,
`pip install -e ".[extra]"` (from the repository's root), and names an extra setup.py declares."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILES = [p for d in ("pipo_jax", "experiments", "configs", "tests", "docs") for p in sorted((ROOT / d).rglob("*"))
         if p.suffix in (".py", ".md")] + [ROOT / "README.md", ROOT / "ARCHITECTURE.md"]
# the form, also inside a Python string (\") and a regex (\. \[ \])
ONE_FORM = re.compile(r'pip install -e \\?"(?:\\?\.)(?:\\?\[)([\w,{}.]+?)(?:\\?\])\\?"')


def _extras() -> set[str]:
    call = next(n for n in ast.walk(ast.parse((ROOT / "setup.py").read_text()))
                if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    extras = next(k.value for k in call.keywords if k.arg == "extras_require")
    return {key.value for key in extras.keys}


def test_every_extra_hint_has_the_readmes_form_and_names_a_declared_extra():
    other_forms, unknown, seen = [], [], 0
    extras = _extras()
    for path in FILES:
        text = path.read_text()
        where = path.relative_to(ROOT)
        other_forms += [f"{where}: {m[0]}" for m in re.finditer(r"pip install[^\n]*?(?:pipo_jax\[|'\.\[)[^\n]*", text)]
        for m in ONE_FORM.finditer(text):
            seen += 1
            names = [n for n in m[1].split(",") if not n.startswith("{")]  # an f-string's field is read at run time
            unknown += [f"{where}: {n}" for n in names if n not in extras and n != "xyz" and n != "extra"]
    assert not other_forms, other_forms
    assert not unknown, unknown
    assert seen >= 15  # the hints of serve, data, rg, track, readiness and test in code and docs


def test_the_serve_extras_hint_is_the_docs_form():
    from experiments import serving

    assert serving.EXTRA_HINT == 'pip install -e ".[serve]" (google-jetstream)'
    assert 'pip install -e ".[serve]"' in (ROOT / "docs" / "serving.md").read_text()
