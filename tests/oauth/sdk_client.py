"""A real MCP client with OAuth: the official MCP Python SDK's
OAuthClientProvider against a running loomem. It discovers the metadata from
the 401 of /mcp, registers itself, is sent to the consent page (which this
script answers over HTTP with an API key, as an operator would in a browser),
trades the code for a token with PKCE, then lists the tools, stores a memory
and searches. Prints one JSON line with what it saw.

Usage: sdk_client.py BASE_URL API_KEY STREAMS CONTENT QUERY
"""

import asyncio
import html
import json
import re
import sys
from urllib.parse import parse_qs, urlparse

import httpx
from mcp import ClientSession
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamablehttp_client
from mcp.shared.auth import OAuthClientMetadata


class MemoryStorage(TokenStorage):
    def __init__(self):
        self.tokens = None
        self.client = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, client_info):
        self.client = client_info


async def main(base, api_key, streams, content, query):
    answer = {}

    async def consent(url):
        # What a person does in the browser: open the page, sign in, allow.
        async with httpx.AsyncClient() as http:
            page = await http.get(url)
            assert page.status_code == 200, page.text
            fields = {
                k: html.unescape(v)
                for k, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page.text)
            }
            fields.update(api_key=api_key, role="writer", streams=streams)
            allowed = await http.post(f"{base}/oauth/authorize", data=fields)
            assert allowed.status_code == 302, allowed.text
            q = parse_qs(urlparse(allowed.headers["location"]).query)
            answer["code"] = q["code"][0]
            answer["state"] = q.get("state", [None])[0]

    async def callback():
        return answer["code"], answer["state"]

    storage = MemoryStorage()
    auth = OAuthClientProvider(
        server_url=f"{base}/mcp",
        client_metadata=OAuthClientMetadata(
            client_name="mcp-sdk-test",
            redirect_uris=["http://127.0.0.1:9/callback"],
            grant_types=["authorization_code", "refresh_token"],
            response_types=["code"],
        ),
        storage=storage,
        redirect_handler=consent,
        callback_handler=callback,
    )
    async with streamablehttp_client(f"{base}/mcp", auth=auth) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = sorted(t.name for t in (await session.list_tools()).tools)
            stored = await session.call_tool("memory_store", {"content": content})
            found = await session.call_tool("memory_search", {"query": query})
    print(
        json.dumps(
            {
                "tools": tools,
                "stored": "".join(c.text for c in stored.content if hasattr(c, "text")),
                "stored_error": stored.isError,
                "found": "".join(c.text for c in found.content if hasattr(c, "text")),
                "client_id": storage.client.client_id,
                "has_refresh_token": bool(storage.tokens and storage.tokens.refresh_token),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
