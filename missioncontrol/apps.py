from django.apps import AppConfig


class MissioncontrolConfig(AppConfig):
    name = "missioncontrol"
