"""What the chat page does, without the page: `ChatPage`, the chats and replies of every user,
the rows a chat shows, the Server tab's figures, refusals in words. No Gradio here."""
