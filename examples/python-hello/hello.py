"""A warm Python function (handler hello.handle).

Stoke imports this module once and calls handle for every invocation with
the decoded JSON input and a context; the return value is JSON-encoded as the
output. print() goes to the Run's log, never into the result.
"""


def handle(event, context):
    name = event.get("name", "world") if isinstance(event, dict) else "world"
    if not isinstance(name, str) or not name:
        raise ValueError("name must be a non-empty string")
    print(f"greeting {name}")
    context.set_output("greeted", name)
    return {"message": f"hello, {name}", "invocationId": context.invocation_id}
