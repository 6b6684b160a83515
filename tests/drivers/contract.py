"""The behaviour every ComputeDriver must show, generic over drivers.

A driver's test module subclasses :class:`DriverContract` and provides two
fixtures: ``driver`` (a ready driver) and ``spec`` (an :class:`InstanceSpec`
with a key unique to the test). The suite cleans up what it creates.
"""

from __future__ import annotations

import pytest

from workers.drivers.base import ComputeDriver, DriverError, InstanceSpec, InstanceState, NetworkPolicy


class DriverContract:
    @pytest.fixture
    def provisioned(self, driver: ComputeDriver, spec: InstanceSpec):
        status = driver.provision(spec)
        yield status
        driver.destroy(spec.key)

    def test_provision_runs_with_a_private_ip(self, driver, spec, provisioned):
        assert provisioned.state == InstanceState.RUNNING
        assert provisioned.private_ip
        assert driver.status(spec.key) == provisioned

    def test_provision_is_idempotent(self, driver, spec, provisioned):
        again = driver.provision(spec)
        assert again.state == InstanceState.RUNNING
        assert again.private_ip == provisioned.private_ip
        assert [i.key for i in driver.list_instances()].count(spec.key) == 1

    def test_stop_keeps_the_instance_and_start_brings_it_back(self, driver, spec, provisioned):
        assert driver.stop(spec.key).state == InstanceState.STOPPED
        assert driver.stop(spec.key).state == InstanceState.STOPPED
        assert driver.status(spec.key).state == InstanceState.STOPPED
        assert driver.start(spec.key).state == InstanceState.RUNNING
        assert driver.start(spec.key).state == InstanceState.RUNNING

    def test_suspend_and_resume(self, driver, spec, provisioned):
        assert driver.suspend(spec.key).state == InstanceState.SUSPENDED
        assert driver.suspend(spec.key).state == InstanceState.SUSPENDED
        assert driver.resume(spec.key).state == InstanceState.RUNNING
        assert driver.resume(spec.key).state == InstanceState.RUNNING

    def test_destroy_removes_and_is_idempotent(self, driver, spec):
        driver.provision(spec)
        driver.destroy(spec.key)
        driver.destroy(spec.key)
        assert driver.status(spec.key).state == InstanceState.ABSENT
        assert spec.key not in [i.key for i in driver.list_instances()]

    def test_destroy_of_a_stopped_instance(self, driver, spec):
        driver.provision(spec)
        driver.stop(spec.key)
        driver.destroy(spec.key)
        assert driver.status(spec.key).state == InstanceState.ABSENT

    def test_list_instances_reports_state(self, driver, spec, provisioned):
        listed = {i.key: i for i in driver.list_instances()}
        assert listed[spec.key].state == InstanceState.RUNNING

    def test_unknown_instance_is_absent(self, driver, spec):
        assert driver.status(spec.key).state == InstanceState.ABSENT

    @pytest.mark.parametrize("step", ["start", "stop", "suspend", "resume"])
    def test_steps_on_an_absent_instance_fail_permanently(self, driver, spec, step):
        with pytest.raises(DriverError) as raised:
            getattr(driver, step)(spec.key)
        assert not raised.value.transient
        assert raised.value.message

    def test_disk_usage_is_what_the_disk_holds_and_unknown_without_one(self, driver, spec, provisioned):
        assert 0 < driver.disk_usage(spec.key) <= spec.disk_gib * 1024**3
        driver.destroy(spec.key)
        assert driver.disk_usage(spec.key) is None

    def test_network_policy_applies_to_a_running_instance(self, driver, spec, provisioned):
        driver.apply_network_policy(spec.key, NetworkPolicy(allow_internet=False))
        driver.apply_network_policy(spec.key, NetworkPolicy())
        assert driver.status(spec.key).state == InstanceState.RUNNING
