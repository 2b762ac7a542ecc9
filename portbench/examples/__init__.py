"""Example policies of the book's "Add your own scheduler" chapter: files a user copies and edits.

They are not registered with the package's policies (nothing here is imported by default, and no
campaign table holds them): the chapter, ``portbench campaign --policy-module FILE`` and
``portbench realengine replay --policy-module FILE`` load a file by its path, as they load a user's.
"""
