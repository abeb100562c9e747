#!/usr/bin/env python
"""Rewrite docs/config.md's key tables from the settings the code declares
(ibtmpi/settings.py): rows, order and defaults; each row keeps its prose.
tests/unit/test_docs_config.py fails until this has been run after a key
was added, removed or its default changed.

  python tools/config_doc.py            # rewrite docs/config.md
  python tools/config_doc.py --check    # exit 1 if it would change
"""
import os
import sys

from ibtmpi.config import doc_tables

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "config.md")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    text = open(DOC).read()
    new = doc_tables(text)
    if "--check" in argv:
        if new != text:
            print("docs/config.md differs from the declared settings: run "
                  "python tools/config_doc.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        with open(DOC, "w") as f:
            f.write(new)
        print("docs/config.md rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
