"""Password guessing on the admin login is slowed down: lockouts per name and address."""

from __future__ import annotations

from dynask.web.login_throttle import LoginThrottle
from tests.web.admin_stack import PASSWORD, AdminStack, csrf_of


class Clock:
    """Time that moves only when told (the throttle reads it through ``clock``)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_five_failures_lock_the_name_and_the_address_for_a_doubling_while() -> None:
    clock = Clock()
    throttle = LoginThrottle(max_failures=5, lockout_s=30, max_lockout_s=100, clock=clock)
    for _ in range(4):
        throttle.failed("admin", "10.0.0.1")
    assert throttle.retry_after("admin", "10.0.0.1") == 0
    throttle.failed("admin", "10.0.0.1")
    assert throttle.retry_after("admin", "10.0.0.1") == 30
    assert throttle.retry_after("admin", "10.0.0.9") == 30  # the name, from anywhere
    assert throttle.retry_after("ADMIN", "10.0.0.9") == 30  # names are case-insensitive
    assert throttle.retry_after("bob", "10.0.0.1") == 30  # the address, for any name
    assert throttle.retry_after("bob", "10.0.0.9") == 0

    clock.now += 31
    assert throttle.retry_after("admin", "10.0.0.1") == 0
    for _ in range(5):
        throttle.failed("admin", "10.0.0.1")
    assert throttle.retry_after("admin", "10.0.0.1") == 60  # the second lockout doubles
    clock.now += 61
    for _ in range(5):
        throttle.failed("admin", "10.0.0.1")
    assert throttle.retry_after("admin", "10.0.0.1") == 100  # capped

    throttle.succeeded("admin", "10.0.0.1")
    assert throttle.retry_after("admin", "10.0.0.1") == 0


def test_failures_older_than_the_window_do_not_count() -> None:
    clock = Clock()
    throttle = LoginThrottle(max_failures=3, window_s=60, clock=clock)
    throttle.failed("admin", "a")
    throttle.failed("admin", "a")
    clock.now += 61
    throttle.failed("admin", "a")
    assert throttle.retry_after("admin", "a") == 0


def test_the_tables_stay_bounded() -> None:
    throttle = LoginThrottle(max_entries=100)
    for n in range(1000):
        throttle.failed(f"user{n}", f"10.0.{n // 256}.{n % 256}")
    assert len(throttle._records) == 100


def test_a_locked_out_login_gets_429_even_with_the_right_password(stack: AdminStack) -> None:
    token = csrf_of(stack.client.get("/admin/login").text)
    wrong = {"username": "admin", "password": "wrong", "csrf_token": token}
    for _ in range(5):
        assert stack.client.post("/admin/login", data=wrong).status_code == 401

    right = {**wrong, "password": PASSWORD}
    response = stack.client.post("/admin/login", data=right)

    assert response.status_code == 429
    assert 0 < int(response.headers["retry-after"]) <= 30
    assert "Too many failed logins; try again in" in response.text
    # Nothing was logged in: the admin pages still need a login.
    assert stack.client.get("/admin/deployments").status_code == 401
