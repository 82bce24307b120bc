"""The fake Discord's handlers, one per operation, and the interaction payload a slash command sends (a
mixin of FakeDiscord, which holds the state they read and write: channels, threads, webhooks,
interactions, attachments, commands, under its lock)."""

from __future__ import annotations

import json
import threading
from typing import Any

from tests.fakes.discord_wire import (
    APPLICATION_ID,
    BOT_USER_ID,
    GUILD_ID,
    DRequest,
    Hook,
    Message,
    Reply,
    error_reply,
    now_iso,
)


class DiscordHandlers:
    """Discord's answers to the requests FakeDiscord routes here."""

    lock: threading.RLock
    channels: dict[str, list[Message]]
    threads: dict[str, dict[str, Any]]
    hooks: dict[str, Hook]
    interactions: dict[str, dict[str, Any]]
    born: dict[str, float]
    files: dict[str, tuple[str, bytes]]
    commands: dict[str, list[dict[str, Any]]]

    def snowflake(self) -> str:
        raise NotImplementedError

    def add_attachment(self, filename: str, data: bytes) -> str:
        raise NotImplementedError

    def add_interaction(self, channel_id: int | str, application_id: int | str) -> tuple[int, str]:
        raise NotImplementedError

    # -- what a slash command sends (for tests to hand to the bot) -----------------------------------
    def interaction_payload(
        self,
        command: str,
        options: dict[str, Any] | None = None,
        *,
        user_id: int,
        channel_id: int,
        guild_id: int | None,
        role_ids: tuple[int, ...] = (),
        focused: str | None = None,
    ) -> dict[str, Any]:
        """An INTERACTION_CREATE payload as Discord's gateway sends it for a slash command (or, with
        `focused`, for its autocomplete), registered here so its callback and followups are accepted.

        Option values: str (STRING), bool (BOOLEAN), int (INTEGER), or (filename, bytes) for an ATTACHMENT,
        which the fake then serves for download. No guild_id: a DM."""
        iid, token = self.add_interaction(channel_id, APPLICATION_ID)
        user = {"id": str(user_id), "username": f"user{user_id}", "discriminator": "0", "avatar": None}
        opts: list[dict[str, Any]] = []
        resolved: dict[str, Any] = {}
        for name, value in (options or {}).items():
            if isinstance(value, tuple):
                filename, data = value
                url = self.add_attachment(filename, data)
                aid = url.rsplit("/", 2)[-2]
                resolved.setdefault("attachments", {})[aid] = {
                    "id": aid,
                    "filename": filename,
                    "size": len(data),
                    "url": url,
                    "proxy_url": url,
                }
                opts.append({"name": name, "type": 11, "value": aid})
            else:
                kind = 5 if isinstance(value, bool) else 4 if isinstance(value, int) else 3
                opts.append({"name": name, "type": kind, "value": value})
            if name == focused:
                opts[-1]["focused"] = True
        payload: dict[str, Any] = {
            "id": str(iid),
            "application_id": APPLICATION_ID,
            "type": 4 if focused else 2,
            "token": token,
            "version": 1,
            "channel_id": str(channel_id),
            "data": {
                "id": self.snowflake(),
                "name": command,
                "type": 1,
                "options": opts,
                "resolved": resolved,
            },
            "locale": "en-US",
            "app_permissions": "0",
            "entitlements": [],
            "attachment_size_limit": 26214400,
        }
        if guild_id is None:
            payload.update(
                user=user,
                context=1,
                channel={"id": str(channel_id), "type": 1, "recipients": [user], "last_message_id": None},
            )
            return payload
        payload.update(
            guild_id=str(guild_id),
            guild_locale="en-US",
            context=0,
            authorizing_integration_owners={"0": str(guild_id)},
            member={
                "user": user,
                "roles": [str(r) for r in role_ids],
                "joined_at": now_iso(),
                "deaf": False,
                "mute": False,
                "flags": 0,
                "permissions": "0",
            },
            channel={
                "id": str(channel_id),
                "type": 0,
                "guild_id": str(guild_id),
                "name": "fleet",
                "position": 0,
                "permission_overwrites": [],
                "nsfw": False,
                "parent_id": None,
            },
        )
        return payload

    # -- handlers ----------------------------------------------------------------------------------
    def _bot_user(self) -> dict[str, Any]:
        return {
            "id": BOT_USER_ID,
            "username": "fake-bot",
            "discriminator": "0",
            "avatar": None,
            "global_name": None,
            "bot": True,
        }

    def _application(self) -> dict[str, Any]:
        return {
            "id": APPLICATION_ID,
            "name": "fake-app",
            "description": "",
            "icon": None,
            "bot_public": False,
            "bot_require_code_grant": False,
            "owner": self._bot_user(),
            "verify_key": "0" * 64,
            "flags": 0,
        }

    def _put_commands(self, r: DRequest) -> Reply:
        scope = r.segments[5] if len(r.segments) == 7 else "global"
        commands = [
            {**cmd, "id": self.snowflake(), "application_id": APPLICATION_ID, "version": "1"}
            for cmd in json.loads(r.body or b"[]")
        ]
        if scope != "global":
            commands = [{**cmd, "guild_id": scope} for cmd in commands]
        with self.lock:
            self.commands[scope] = commands
        return Reply(200, commands)

    def _target(self, r: DRequest) -> tuple[str, Hook | None]:
        """(channel id, webhook or None) a message request addresses."""
        rest = r.segments[2:]
        if rest[0] == "channels":
            return rest[1], None
        hook = self.hooks[rest[2]]
        return hook.channel_id, hook

    def _find(self, r: DRequest) -> Message | None:
        channel_id, hook = self._target(r)
        mid = r.segments[-1]
        if mid == "@original" and hook is not None:
            mid = hook.original_id or ""
        return next((msg for msg in self.channels.get(channel_id, []) if msg.id == mid), None)

    def _store(
        self, channel_id: str, data: dict[str, Any], files: list[tuple[str, bytes]], hook: Hook | None
    ) -> Message:
        author = (
            self._bot_user()
            if hook is None
            else {
                "id": hook.id,
                "username": str(data.get("username") or "fake-hook"),
                "discriminator": "0000",
                "avatar": None,
                "bot": True,
            }
        )
        msg = Message(
            id=self.snowflake(),
            channel_id=channel_id,
            content=str(data.get("content") or ""),
            embeds=list(data.get("embeds") or []),
            attachments=self._attach(files),
            author=author,
            webhook_id=None if hook is None or hook.interaction_id else hook.id,
        )
        with self.lock:
            self.channels.setdefault(channel_id, []).append(msg)
        return msg

    def _attach(self, files: list[tuple[str, bytes]]) -> list[dict[str, Any]]:
        out = []
        for name, data in files:
            url = self.add_attachment(name, data)
            aid = url.rsplit("/", 2)[-2]
            out.append({"id": aid, "filename": name, "size": len(data), "url": url, "proxy_url": url})
        return out

    def _create(self, r: DRequest) -> Reply:
        data, files = r.payload()
        channel_id, nonce = r.segments[3], data.get("nonce")
        if channel_id in self.deleted:
            return error_reply(404, "Unknown Channel", 10003)
        with self.lock:  # one lock for the lookup and the store: two racing repeats yield one message
            if nonce is not None and data.get("enforce_nonce"):
                earlier = next((m for m in self.channels.get(channel_id, []) if m.nonce == str(nonce)), None)
                if earlier is not None:
                    return Reply(200, earlier.wire())
            msg = self._store(channel_id, data, files, None)
            msg.nonce = None if nonce is None else str(nonce)
        return Reply(200, msg.wire())

    def _start_thread(self, r: DRequest) -> Reply:
        """A public thread in channel c: from message m (the thread's id is m's), or without one (Discord
        then leaves a notice, type 18, whose content is the thread's name, in the parent)."""
        data, _ = r.payload()
        parent, rest = r.segments[3], r.segments[2:]
        name = str(data.get("name") or "")
        if not 1 <= len(name) <= 100:
            return error_reply(400, "Invalid Form Body: name must be 1 to 100 characters", 50035)
        with self.lock:
            if len(rest) == 5:
                if not any(msg.id == rest[3] for msg in self.channels.get(parent, [])):
                    return error_reply(404, "Unknown Message", 10008)
                thread_id = rest[3]
                if thread_id in self.threads:
                    return error_reply(400, "A thread has already been created for this message", 160004)
            else:
                thread_id = self.snowflake()
            thread = {
                "id": thread_id,
                "type": int(data.get("type") or 11),
                "guild_id": GUILD_ID,
                "parent_id": parent,
                "owner_id": BOT_USER_ID,
                "name": name,
                "rate_limit_per_user": 0,
                "message_count": 0,
                "member_count": 1,
                "flags": 0,
                "thread_metadata": {
                    "archived": False,
                    "auto_archive_duration": int(data.get("auto_archive_duration") or 1440),
                    "archive_timestamp": now_iso(),
                    "locked": False,
                },
            }
            self.threads[thread_id] = thread
            self.channels.setdefault(thread_id, [])
        if len(rest) == 3:
            notice = self._store(parent, {"content": name}, [], None)
            notice.type = 18
        return Reply(201, thread)

    def _execute(self, r: DRequest) -> Reply:
        data, files = r.payload()
        channel_id, hook = self._target(r)
        msg = self._store(channel_id, data, files, hook)
        if hook is not None and hook.interaction_id is not None:
            with self.lock:
                record = self.interactions[hook.interaction_id]
                flags = int(data.get("flags") or 0)
                callbacks = record["callbacks"]
                if not record["followups"] and callbacks and callbacks[0]["type"] == 5:
                    # Discord: the first followup after a deferral is the deferred message, as private or
                    # public as the deferral was, whatever its own flags say.
                    flags = int(callbacks[0]["data"].get("flags") or 0)
                record["followups"].append(
                    {"message_id": msg.id, "data": data, "ephemeral": bool(flags & 64)}
                )
        return Reply(200, msg.wire()) if r.query.get("wait") in ("true", "1", "True") else Reply(204)

    def _list(self, r: DRequest) -> Reply:
        msgs = self.channels.get(r.segments[3], [])
        limit = int(r.query.get("limit", 50))
        return Reply(200, [m.wire() for m in reversed(msgs)][:limit])  # newest first, as Discord

    def _get(self, r: DRequest) -> Reply:
        msg = self._find(r)
        return error_reply(404, "404: Not Found", 10008) if msg is None else Reply(200, msg.wire())

    def _edit(self, r: DRequest) -> Reply:
        if r.segments[2] == "channels" and r.segments[3] in self.deleted:
            return error_reply(404, "Unknown Channel", 10003)
        msg = self._find(r)
        if msg is None:
            return error_reply(404, "Unknown Message", 10008)
        data, files = r.payload()
        with self.lock:
            if "content" in data:
                msg.content = str(data["content"] or "")
            if "embeds" in data:
                msg.embeds = list(data["embeds"] or [])
            if "attachments" in data:  # v10: the attachments to keep, by id (and the new uploads')
                keep = {str(a.get("id")) for a in data["attachments"] or []}
                msg.attachments = [a for a in msg.attachments if a["id"] in keep]
            msg.attachments += self._attach(files)
            msg.edited = now_iso()
            msg.edits.append({"content": msg.content, "embeds": msg.embeds, "at": msg.edited})
        return Reply(200, msg.wire())

    def _info(self, r: DRequest) -> Reply:
        _, hook = self._target(r)
        assert hook is not None
        return Reply(
            200,
            {
                "id": hook.id,
                "type": 1,
                "token": hook.token,
                "channel_id": hook.channel_id,
                "guild_id": None,
                "name": "fake-hook",
                "avatar": None,
                "application_id": None,
            },
        )

    def _callback(self, r: DRequest) -> Reply:
        data, files = r.payload()
        hook = self.hooks[r.segments[4]]
        iid = str(hook.interaction_id)
        kind = int(data.get("type", 0))
        inner = dict(data.get("data") or {})
        msg = None
        if kind in (4, 5):  # CHANNEL_MESSAGE_WITH_SOURCE, DEFERRED_...: an original response exists
            msg = self._store(hook.channel_id, inner, files, hook)
            hook.original_id = msg.id
        with self.lock:
            self.interactions[iid]["callbacks"].append({"type": kind, "data": inner})
        interaction = {
            "id": iid,
            "type": 2,
            "response_message_id": msg.id if msg else None,
            "response_message_loading": kind == 5,
            "response_message_ephemeral": bool(int(inner.get("flags") or 0) & 64),
        }
        resource = {"type": kind, "message": msg.wire()} if msg else None
        if r.query.get("with_response") in ("1", "true", "True"):
            return Reply(200, {"interaction": interaction, "resource": resource})
        return Reply(204)

    def _attachment(self, r: DRequest) -> Reply:
        found = self.files.get(r.segments[1])
        if found is None or found[0] != r.segments[2]:
            return error_reply(404, "404: Not Found")
        return Reply(200, raw=found[1], content_type="application/octet-stream")
