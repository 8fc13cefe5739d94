"""A chat page read once (ChatStore.page) and the page after a turn built from it and what the turn saved
(ChatPage.after): the same as reading it again, unless the conversation changed in between (another
tab's turn), which reads it again. On SQLite and on PostgreSQL."""

from __future__ import annotations

from webapp.chat.decode.types import ReplyStats
from webapp.chat.store import ROOT, ChatStore
from webapp.db import open_database


def a_store(location: str) -> ChatStore:
    database = open_database(location)
    database.init()
    return ChatStore(database)


def turn(store: ChatStore, owner: str, conversation: str | None, text: str | None = "q", branch_from=None):
    return store.begin_turn(owner, conversation, user_text=text, branch_from=branch_from, settings={"seed": 1},
                            prompt={"ids": [1]})


def finish(store: ChatStore, ids) -> None:
    store.finish_reply(ids.reply_id, "a", "complete", None, ReplyStats())


def same(a, b) -> None:
    assert a.conversation == b.conversation and a.conversations == b.conversations
    assert a.messages == b.messages and a.share_token == b.share_token and a.leaf == b.leaf


def test_a_page_is_the_conversation_its_branch_the_sidebar_and_the_link(database_location):
    store = a_store(database_location)
    first = turn(store, "me", None)
    finish(store, first)
    other = turn(store, "me", None, "another")
    turn(store, "you", None, "not mine")
    token = store.share_conversation("me", first.conversation_id)
    page = store.page("me", first.conversation_id)
    assert page is not None and page.conversation == store.conversation("me", first.conversation_id)
    assert page.messages == store.messages(first.conversation_id) and page.share_token == token
    assert page.conversations == store.conversations("me")
    assert [c.id for c in page.conversations] == [other.conversation_id, first.conversation_id]
    assert store.page("me", other.conversation_id).share_token is None
    assert store.page("you", first.conversation_id) is None  # not theirs
    new_chat = store.page("me", None)
    assert new_chat.conversation is None and new_chat.messages == [] and len(new_chat.conversations) == 2


def test_the_page_after_a_turn_is_the_page_read_again(database_location):
    store = a_store(database_location)
    ids = turn(store, "me", None)  # a new conversation
    after = store.page("me", None).after(ids)
    assert after is not None
    same(after, store.page("me", ids.conversation_id))
    finish(store, ids)
    for kind in ("send", "regenerate", "edit first"):
        before = store.page("me", ids.conversation_id)
        last = before.messages[-1]
        if kind == "send":
            ids = turn(store, "me", ids.conversation_id, "next")
        elif kind == "regenerate":
            ids = turn(store, "me", ids.conversation_id, None, branch_from=last.parent_id or ROOT)
        else:
            ids = turn(store, "me", ids.conversation_id, "a new first question", branch_from=ROOT)
        after = before.after(ids)
        assert after is not None, kind
        same(after, store.page("me", ids.conversation_id))
        assert after.messages[-1].status == "pending" and after.messages[-1].versions
        finish(store, ids)


def test_a_conversation_changed_between_the_page_and_the_turn_is_read_again(database_location):
    store = a_store(database_location)
    first = turn(store, "me", None)
    finish(store, first)
    before = store.page("me", first.conversation_id)
    finish(store, turn(store, "me", first.conversation_id, "from another tab"))
    mine = turn(store, "me", first.conversation_id, "from this tab")
    assert before.after(mine) is None  # the tree it read is not the tree the turn went into
    finish(store, mine)
    before = store.page("me", first.conversation_id)
    # Another tab regenerates the last reply, then shows this version again: the leaf is the one read,
    # but the tree has a version more.
    finish(store, turn(store, "me", first.conversation_id, None, branch_from=mine.user_id))
    store.show_message(first.conversation_id, before.leaf)
    assert before.after(turn(store, "me", first.conversation_id, "again")) is None


def test_the_details_of_several_replies_are_read_at_once_as_one_by_one(database_location):
    store = a_store(database_location)
    first = turn(store, "me", None)
    store.finish_reply(first.reply_id, "a", "complete", None, ReplyStats(), odds=[[1, 0.5]])
    second = turn(store, "me", first.conversation_id)
    ids = [first.reply_id, second.reply_id, second.user_id]  # a question has no details
    assert store.details_of(ids) == {i: store.details(i) for i in ids}
    assert store.details_of([]) == {}


def test_a_damaged_row_reads_as_missing_never_an_error(database_location):
    # a status this code does not know (a hand, a newer front end on a shared database) and settings that are not
    # JSON: the branch still reads, the reply as an error with no settings
    store = a_store(database_location)
    ids = turn(store, "me", None)
    with store.db.transaction() as db:
        db.execute("UPDATE messages SET status = 'archived', settings = '{not json' WHERE id = ?", (ids.reply_id,))
    reply = store.messages(ids.conversation_id)[-1]
    assert (reply.status, reply.settings) == ("error", None)
    assert store.page("me", ids.conversation_id).messages[-1].status == "error"
